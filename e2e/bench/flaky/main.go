// Command flaky is the benchmark's scripted upstream: one process, several
// HTTP/1.1 listeners, each answering 503 to a given share of its requests and
// counting every request it receives (the "upstream attempts"). It also serves
// large bodies for the large-body scenario:
//
//	GET  /big?bytes=N   streams N zero bytes (Content-Length set)
//	PUT  /upload        reads the whole body, answers with its length
//	anything else       200 "ok\n", or 503 for fail% of requests
//
// Listeners given with -h2c also accept HTTP/2 over cleartext (prior
// knowledge), for the HTTP/2-to-upstream scenario.
//
// An admin listener answers GET /counts (JSON: listener -> requests) and
// POST /reset (zeroes the counters).
//
//	flaky -admin 127.0.0.1:18100 -listen 127.0.0.1:18101=0,127.0.0.1:18103=50
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type listener struct {
	addr     string
	failPct  int
	h2c      bool
	requests atomic.Int64
}

var zeros = make([]byte, 256<<10)

// smallBody is the same 128 bytes the nginx upstream answers.
const smallBody = "reprise-bench small body 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdefghijkl\n"

func (l *listener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.requests.Add(1)
	switch {
	case r.URL.Path == "/big" && r.Method == http.MethodGet:
		n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad bytes", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		w.Header().Set("Content-Type", "application/octet-stream")
		for n > 0 {
			c := int64(len(zeros))
			if n < c {
				c = n
			}
			if _, err := w.Write(zeros[:c]); err != nil {
				return
			}
			n -= c
		}
		return
	case r.URL.Path == "/upload":
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d\n", n)
		return
	}
	// Drain any small body so the connection stays reusable.
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	if l.failPct > 0 && rand.IntN(100) < l.failPct {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "unavailable\n")
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, smallBody)
}

func main() {
	admin := flag.String("admin", "127.0.0.1:18100", "admin listener (GET /counts, POST /reset)")
	listen := flag.String("listen", "", "comma-separated ADDR=FAIL_PERCENT")
	h2c := flag.String("h2c", "", "comma-separated ADDR=FAIL_PERCENT, HTTP/1.1 and h2c")
	flag.Parse()
	var ls []*listener
	isH2c := map[string]bool{}
	for _, spec := range strings.Split(*h2c, ",") {
		if spec != "" {
			isH2c[spec] = true
		}
	}
	for _, spec := range strings.Split(*listen+","+*h2c, ",") {
		if spec == "" {
			continue
		}
		addr, pct, ok := strings.Cut(spec, "=")
		p, err := strconv.Atoi(pct)
		if !ok || err != nil || p < 0 || p > 100 {
			log.Fatalf("bad listener spec %q (want ADDR=FAIL_PERCENT)", spec)
		}
		ls = append(ls, &listener{addr: addr, failPct: p, h2c: isH2c[spec]})
	}
	if len(ls) == 0 {
		log.Fatal("no -listen given")
	}
	var wg sync.WaitGroup
	for _, l := range ls {
		srv := &http.Server{Addr: l.addr, Handler: l, ReadHeaderTimeout: 30 * time.Second}
		if l.h2c {
			var p http.Protocols
			p.SetHTTP1(true)
			p.SetUnencryptedHTTP2(true)
			srv.Protocols = &p
			srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1024}
		}
		wg.Add(1)
		go func() { defer wg.Done(); log.Fatal(srv.ListenAndServe()) }()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/counts", func(w http.ResponseWriter, _ *http.Request) {
		out := map[string]int64{}
		for _, l := range ls {
			out[l.addr] = l.requests.Load()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("/reset", func(w http.ResponseWriter, _ *http.Request) {
		for _, l := range ls {
			l.requests.Store(0)
		}
		_, _ = io.WriteString(w, "reset\n")
	})
	log.Fatal(http.ListenAndServe(*admin, mux))
}
