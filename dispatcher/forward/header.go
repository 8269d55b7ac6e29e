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

// notForwarded are request fields the forwarder writes itself (Host,
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

// named says whether a Connection header lists key (a field of that
// connection only). It allocates nothing.
func named(connection []string, key string) bool {
	for _, v := range connection {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(textproto.TrimString(t), key) {
				return true
			}
		}
	}
	return false
}

// hasToken says whether a comma-separated field has token, ignoring case.
func hasToken(values []string, token string) bool { return named(values, token) }

// endToEnd says whether a field of a message whose Connection header is
// connection goes on to the next hop.
func endToEnd(key string, connection []string) bool {
	return !hopByHop[key] && (len(connection) == 0 || !named(connection, key))
}

// copyHeader adds src's fields to dst, sharing src's slices where dst has
// none (src is the backend's, read for this answer only).
func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		if old, ok := dst[k]; ok {
			dst[k] = append(old, vv...)
		} else {
			dst[k] = vv
		}
	}
}

// copyAnswerHeader adds the end-to-end fields of the backend's answer to
// dst. An answer without a Content-Type keeps none: net/http would
// otherwise sniff one.
func copyAnswerHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if !endToEnd(k, conn) {
			continue
		}
		if old, ok := dst[k]; ok {
			dst[k] = append(old, vv...)
		} else {
			dst[k] = vv
		}
	}
	if _, ok := dst["Content-Type"]; !ok {
		dst["Content-Type"] = nil
	}
}
