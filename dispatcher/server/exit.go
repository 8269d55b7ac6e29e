package server

import (
	"net/http"

	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/metrics"
)

// outcome is how a request ended, as the data path's stages report it.
// Only the exit (ServeHTTP) writes what it says and counts it; the zero
// outcome is an answer already forwarded, counted with the status written.
type outcome struct {
	// refusal, when set, is written by the exit and counted in
	// rejections_total by its cause.
	refusal *apierror.Error
	// code, when not 0, is the requests_total code of an answer the exit
	// does not write: 499 (the client left), 502 (a stream the backend
	// cut) or 101 (written on the switched connection).
	code int
	// stage, when set, counts the request in abandoned_total.
	stage string
	// abort ends the handler with http.ErrAbortHandler once counted, so
	// a client holding the start of a cut answer sees it broken.
	abort bool
	// discard reads what is left of a refused body after the refusal
	// (began: some of it was read; see discardBody).
	discard, began bool
	// err is why a forwarded request failed, for the log.
	err error
}

// served is the outcome of an answer the backend gave.
var served = outcome{}

func refused(e *apierror.Error) outcome { return outcome{refusal: e} }

// clientGone is the 499 of a client that left; stage "" when it left
// before admission (nothing to abandon).
func clientGone(stage string) outcome {
	return outcome{code: statusClientClosed, stage: stage}
}

// exit writes o's answer, if it has one to write, and counts the request
// once: rejections_total by cause, abandoned_total by stage and
// requests_total by code.
func (s *Server) exit(x *exchange, r *http.Request, o outcome) {
	if e := o.refusal; e != nil {
		if e.Tier == "" {
			e.Tier = x.tier // known once the caller is identified
		}
		x.tier = e.Tier // a full queue's is the tier the policy in force gave
		e.Write(&x.sw)
	}
	se := s.series(x)
	if o.refusal != nil {
		se.Reject(o.refusal.Cause)
	}
	if o.stage != "" {
		se.Abandon(o.stage)
	}
	code := x.sw.status()
	if o.code != 0 {
		code = o.code
	}
	se.Request(code)
	if o.err != nil {
		s.logFailure(x, o)
	}
	if o.discard {
		s.discardBody(x.sw.ResponseWriter, r, o.began)
	}
}

// logFailure logs a forwarded request that failed, at V(1): one per
// request under a failing backend.
func (s *Server) logFailure(x *exchange, o outcome) {
	what := "backend failed"
	if o.code == http.StatusBadGateway {
		what = "stream aborted"
	}
	addr := ""
	if x.backend != nil {
		addr = x.backend.Address
	}
	s.cfg.Log.V(1).Info(what, "backend", addr, "err", o.err.Error())
}

// series is the metric series of the exchange's pool and tier: the one the
// policy it started under looked up, else one made for it (a tier of a
// newer policy; a refusal before the pool was known, counted under pool
// "" as it always was; no policy at all).
func (s *Server) series(x *exchange) *metrics.Series {
	if x.st != nil && x.st.pool == x.pool {
		if se, ok := x.st.series[x.tier]; ok {
			return se
		}
	}
	if x.pool == "" && x.tier == "" {
		return s.noPolicy
	}
	return s.m.Series(x.pool, x.tier)
}
