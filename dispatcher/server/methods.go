package server

import (
	"net/http"
	"strings"

	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/forward"
)

// allowedMethods is the Allow header of a 405: every method but CONNECT
// may be proxied.
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// refuseConnect answers CONNECT with 405 and closes the connection: the
// dispatcher is not a tunnel, and nothing of a CONNECT reaches a backend.
func refuseConnect(x *exchange) outcome {
	h := x.sw.Header()
	h.Set("Allow", allowedMethods)
	h.Set("Connection", "close")
	return refused(apierror.MethodNotAllowed(http.MethodConnect))
}

// refuseUpgrade refuses a protocol upgrade (Connection: upgrade with an
// Upgrade header) on a path that is not exempt, with 400: a queued model
// call holds a slot while it runs, and a switched connection would hold it
// for as long as the client likes. An exempt path (a health check, a
// websocket a backend serves outside the queue) may upgrade. An h2c
// upgrade is not a protocol switch of the request's meaning, so it is
// ignored (RFC 9110 section 7.8 lets a server do so) and the request is
// served over HTTP/1.1. ok is false when it refuses, with the refusal.
func refuseUpgrade(r *http.Request, st *state) (o outcome, ok bool) {
	up := r.Header.Get("Upgrade")
	if up == "" || !forward.HasToken(r.Header["Connection"], "upgrade") || st.exempt[r.URL.Path] {
		return outcome{}, true
	}
	if strings.EqualFold(strings.TrimSpace(up), "h2c") && len(r.Header["Upgrade"]) == 1 {
		r.Header.Del("Upgrade")
		r.Header.Del("Http2-Settings")
		return outcome{}, true
	}
	return refused(apierror.BadRequest(upgradeRefused)), false
}

// upgradeRefused is the message of a refused upgrade.
const upgradeRefused = "the dispatcher does not switch protocols on queued paths (the request asks for an Upgrade); only the pool's exempt paths may upgrade"
