module reprise.local/bench

go 1.24
