// Command conns opens N keep-alive HTTP/1.1 client connections to a proxy,
// sends one small GET on each, reads the answer, prints "ready N" and holds
// them open until stdin closes or -hold elapses. Used to measure a proxy's
// memory with many idle client connections.
//
//	conns -addr 127.0.0.1:17001 -host bench -n 1000 -hold 30s
//
// -parallel sets how many connections dial and make their request at once
// (64 by default); -parallel 1000 with a slow answer keeps 1,000 requests in
// flight together, so a proxy opens as many upstream connections.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

func main() {
	addr := flag.String("addr", "", "proxy address")
	host := flag.String("host", "bench", "Host header")
	n := flag.Int("n", 1000, "connections")
	hold := flag.Duration("hold", 30*time.Second, "maximum time to hold them")
	parallel := flag.Int("parallel", 64, "connections dialling and making their request at once")
	flag.Parse()
	conns := make([]net.Conn, *n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	sem := make(chan struct{}, *parallel)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", *addr, 5*time.Second)
			if err == nil {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, err = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", *host)
				if err == nil {
					var resp *http.Response
					resp, err = http.ReadResponse(bufio.NewReader(c), nil)
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
				}
				_ = c.SetDeadline(time.Time{})
			}
			if err != nil {
				mu.Lock()
				if failed == 0 {
					log.Printf("connection %d: %v", i, err)
				}
				failed++
				mu.Unlock()
				if c != nil {
					c.Close()
				}
				return
			}
			conns[i] = c
		}(i)
	}
	wg.Wait()
	fmt.Printf("ready %d failed %d\n", *n-failed, failed)
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-time.After(*hold):
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}
