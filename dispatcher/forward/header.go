package forward

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopByHop are the fields of one connection, never forwarded either way
// (RFC 9110 section 7.6.1), in canonical form.
var hopByHop = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// notForwarded are request fields the Transport writes itself (Host,
// Content-Length) or drops: what a client says of proxies in front of it
// is not vouched for, and Expect was the server's to answer.
var notForwarded = map[string]bool{
	"Host":              true,
	"Content-Length":    true,
	"Expect":            true,
	"Forwarded":         true,
	"X-Forwarded-For":   true,
	"X-Forwarded-Host":  true,
	"X-Forwarded-Proto": true,
}

// HasToken says whether a comma-separated field (its values, as in an
// http.Header) lists token, ignoring case; for Connection, whether token
// is a field of that connection only. It allocates nothing.
func HasToken(values []string, token string) bool {
	for _, v := range values {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// endToEnd says whether a field of a message whose Connection header is
// connection goes on to the next hop.
func endToEnd(key string, connection []string) bool {
	return !hopByHop[key] && (len(connection) == 0 || !HasToken(connection, key))
}

// add appends vv to dst's values of k, sharing vv where dst has none (the
// backend's header is read for this answer only).
func add(dst http.Header, k string, vv []string) {
	if old, ok := dst[k]; ok {
		dst[k] = append(old, vv...)
	} else {
		dst[k] = vv
	}
}

// copyHeader adds src's fields to dst.
func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		add(dst, k, vv)
	}
}

// copyAnswerHeader adds the end-to-end fields of the backend's answer to
// dst. An answer without a Content-Type keeps none: net/http would
// otherwise sniff one.
func copyAnswerHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if endToEnd(k, conn) {
			add(dst, k, vv)
		}
	}
	if _, ok := dst["Content-Type"]; !ok {
		dst["Content-Type"] = nil
	}
}
