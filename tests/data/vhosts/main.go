// An origin with name-based virtual hosts, as Go's net/http and crypto/tls serve them: every
// request is answered `vhost=NAME` where NAME is its Host (plain) or its SNI (TLS). The
// read-or-refuse tests send it what Go reads and the proxy must read the same or refuse.
//
//	go run . CERT KEY   # prints "PLAIN_PORT TLS_PORT"
package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

func main() {
	cert, err := tls.LoadX509KeyPair(os.Args[1], os.Args[2])
	if err != nil {
		panic(err)
	}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	secure, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d %d\n", plain.Addr().(*net.TCPAddr).Port, secure.Addr().(*net.TCPAddr).Port)
	os.Stdout.Sync()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.Split(r.Host, ":")[0]
		if r.TLS != nil {
			name = r.TLS.ServerName
		}
		fmt.Fprintf(w, "vhost=%s method=%s\n", name, r.Method)
	})
	go http.Serve(secure, handler)
	http.Serve(plain, handler)
}
