package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Dispatcher is what the admin port drives.
type Dispatcher interface {
	// Apply switches to p, which is valid. It refuses an older version
	// with an error wrapping policy.ErrStaleVersion.
	Apply(p *policy.Policy) (policy.Ack, error)
	// Policy is the applied policy, or nil.
	Policy() *policy.Policy
	// Stats is a JSON-encodable snapshot.
	Stats() any
	// Ready says whether the data port should get traffic, and if not why.
	Ready() (bool, string)
}

// defaultMaxPolicyBytes bounds a pushed policy.
const defaultMaxPolicyBytes = 8 << 20

// Config of the admin handler.
type Config struct {
	// Token is a fixed bearer token. Tokens, when set, is used instead;
	// with neither the /v1 endpoints are disabled.
	Token    []byte
	Tokens   Tokens
	Gatherer prometheus.Gatherer
	// MaxPolicyBytes bounds a pushed policy; 0 is 8 MiB.
	MaxPolicyBytes int64
	// Profiling serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/, behind the bearer token like /v1/*: a profile shows
	// what the process does, and a CPU profile costs while it runs.
	Profiling bool
	Log       logr.Logger
}

type handler struct {
	cfg    Config
	tokens Tokens // nil: the /v1 endpoints are disabled
	d      Dispatcher
}

// New returns the admin port's handler.
func New(cfg Config, d Dispatcher) (http.Handler, error) {
	if cfg.MaxPolicyBytes == 0 {
		cfg.MaxPolicyBytes = defaultMaxPolicyBytes
	}
	if cfg.MaxPolicyBytes < 0 {
		return nil, fmt.Errorf("admin: MaxPolicyBytes must be > 0, got %d", cfg.MaxPolicyBytes)
	}
	if cfg.Gatherer == nil {
		return nil, errors.New("admin: Gatherer is required")
	}
	h := &handler{cfg: cfg, d: d, tokens: tokensOf(cfg)}
	mux := http.NewServeMux()
	srv := withSchema(mux)
	mux.Handle("PUT /v1/policy", h.auth(h.putPolicy))
	mux.Handle("GET /v1/policy", h.auth(h.getPolicy))
	mux.Handle("GET /v1/stats", h.auth(h.stats))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	if cfg.Profiling {
		mux.Handle("GET /debug/pprof/", h.auth(pprof.Index))
		mux.Handle("GET /debug/pprof/cmdline", h.auth(pprof.Cmdline))
		mux.Handle("GET /debug/pprof/profile", h.auth(pprof.Profile))
		mux.Handle("GET /debug/pprof/symbol", h.auth(pprof.Symbol))
		mux.Handle("GET /debug/pprof/trace", h.auth(pprof.Trace))
	}
	return srv, nil
}

// schemaRevision is SchemaHeader's value.
var schemaRevision = strconv.Itoa(policy.SchemaVersion)

// withSchema names the policy schema revision on every answer, refusals
// and 404s included: the controller learns a dispatcher's revision from
// whatever its push got back.
func withSchema(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(policy.SchemaHeader, schemaRevision)
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":{"type":"`+string(policy.AdminInternal)+`","message":"could not encode the answer"}}`)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, code int, d policy.AdminErrorDetail) {
	writeJSON(w, code, policy.AdminErrorBody{Error: d})
}

func (h *handler) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deny := func(msg string) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tiergate-admin"`)
			writeError(w, http.StatusUnauthorized, policy.AdminErrorDetail{Type: policy.AdminUnauthenticated, Message: msg})
		}
		if h.tokens == nil {
			deny("the admin API is disabled: the dispatcher was started without --admin-token-file")
			return
		}
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
			deny(`missing bearer token; send "Authorization: Bearer <token>"`)
			return
		}
		if !h.tokens.Verify([]byte(tok)) {
			deny("wrong bearer token")
			return
		}
		next(w, r)
	})
}

func (h *handler) putPolicy(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxPolicyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, policy.AdminErrorDetail{Type: policy.AdminBodyTooLarge,
				Message: fmt.Sprintf("the policy is larger than %d bytes", h.cfg.MaxPolicyBytes)})
			return
		}
		writeError(w, http.StatusBadRequest, policy.AdminErrorDetail{Type: policy.AdminInvalidPolicy, Message: "could not read the body: " + err.Error()})
		return
	}
	p, err := policy.DecodeAndValidate(data)
	if err != nil {
		d := policy.AdminErrorDetail{Type: policy.AdminInvalidPolicy, Message: err.Error() + "; the previous policy stays"}
		var verrs policy.ValidationErrors
		if errors.Is(err, policy.ErrUnsupportedSchema) {
			d.Type = policy.AdminUnsupportedSchema
		}
		if errors.As(err, &verrs) {
			d.Message = fmt.Sprintf("the policy has %d error(s); the previous policy stays", len(verrs))
			d.Errors = verrs
		}
		h.cfg.Log.Info("refused an invalid policy", "err", err.Error())
		writeError(w, http.StatusBadRequest, d)
		return
	}
	ack, err := h.d.Apply(p)
	if err != nil {
		var mismatch *policy.PoolMismatchError
		if errors.As(err, &mismatch) {
			h.cfg.Log.Info("refused a policy for another pool", "held", mismatch.Held, "pushed", mismatch.Pushed)
			writeError(w, http.StatusConflict, policy.AdminErrorDetail{Type: policy.AdminPoolMismatch,
				Message: mismatch.Error(), CurrentPool: mismatch.Held})
			return
		}
		if errors.Is(err, policy.ErrStaleVersion) {
			var cur int64
			if c := h.d.Policy(); c != nil {
				cur = c.Version
			}
			writeError(w, http.StatusConflict, policy.AdminErrorDetail{Type: policy.AdminStaleVersion,
				Message:        fmt.Sprintf("policy version %d is older than the applied version %d", p.Version, cur),
				CurrentVersion: &cur})
			return
		}
		writeError(w, http.StatusInternalServerError, policy.AdminErrorDetail{Type: policy.AdminInternal, Message: err.Error()})
		return
	}
	ack.SchemaVersion = policy.SchemaVersion
	writeJSON(w, http.StatusOK, ack)
}

func (h *handler) getPolicy(w http.ResponseWriter, _ *http.Request) {
	p := h.d.Policy()
	if p == nil {
		writeError(w, http.StatusNotFound, policy.AdminErrorDetail{Type: policy.AdminNoPolicy, Message: "no policy has been applied yet"})
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (h *handler) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.d.Stats())
}

func (h *handler) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if ok, why := h.d.Ready(); !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, why+"\n")
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}
