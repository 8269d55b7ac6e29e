// Command rproxy is the benchmark's baseline: a plain
// httputil.ReverseProxy over an http.Transport with the pool settings of
// tiergate's forwarder (dispatcher/forward), and nothing else.
//
//	go run ./hack/bench/rproxy --listen ADDR --backend HOST:PORT
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/tiergate/tiergate/dispatcher/forward"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to serve on")
	backend := flag.String("backend", "127.0.0.1:8000", "host:port to proxy to")
	flag.Parse()
	p := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: *backend})
	p.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: forward.DefaultDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: forward.DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:     forward.DefaultIdleConnTimeout,
		DisableCompression:  true,
	}
	srv := &http.Server{Addr: *listen, Handler: p, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
