package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("simserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `simserver: a STAND-IN for vLLM, for tests, demos and benchmarks. It generates
placeholder tokens ("tok0 tok1 ..."), not model output.

OpenAI-compatible: POST /v1/chat/completions, POST /v1/completions (stream or
not), POST /v1/embeddings, GET /v1/models, GET /health. Every answer reports
usage as vLLM does (a stream: in a last chunk, when the request sets
stream_options.include_usage). Test hooks: GET /debug/stats (peak
concurrency, cancellations and tokens per tenant from the `+TenantHeader+`
header), POST /debug/stats/reset, and the request header `+ServiceTimeHeader+`.

Tokens: a prompt is ceil(its text's bytes / --bytes-per-token) tokens (token
IDs count one each). An answer has --output-tokens tokens, at most the
request's max_completion_tokens, else max_tokens, else --tokens. With
--prefill-tokens-per-second or --decode-tokens-per-second set, a request's
service time is prompt/prefill + output/decode (per generation slot) and
--service-time is not used.

--service-time takes: 0 | const:200ms | 200ms | exp:6s (mean) |
lognormal:MEAN,STDDEV (e.g. lognormal:6s,2s; mean and deviation of the
service time itself). --output-tokens takes the same forms in tokens:
const:100 | 100 | exp:200 | lognormal:200,150.

Flags:`)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve on")
	concurrency := fs.Int("concurrency", 4, "requests generated at once (like vLLM --max-num-seqs); the rest wait in a FIFO")
	dist := fs.String("service-time", "const:200ms", "service time distribution (see above)")
	tokens := fs.Int("tokens", 16, "tokens per answer unless the request sets max_tokens/max_completion_tokens")
	var tok tokenModel
	fs.Float64Var(&tok.bytesPerToken, "bytes-per-token", 4, "prompt bytes per token: how usage.prompt_tokens counts a prompt")
	outputTokens := fs.String("output-tokens", "", "distribution of an answer's tokens, capped at the request's maximum (empty: always the maximum)")
	fs.Float64Var(&tok.prefill, "prefill-tokens-per-second", 0, "prompt tokens one slot prefills per second (0: not modelled)")
	fs.Float64Var(&tok.decode, "decode-tokens-per-second", 0, "output tokens one slot decodes per second (0: not modelled)")
	model := fs.String("model", "sim-model", "model name reported by /v1/models")
	tenantHeader := fs.String("tenant-header", TenantHeader, "header that names the tenant, for the per-tenant statistics")
	seed := fs.Uint64("seed", 1, "seed of the service-time draws")
	verbose := fs.Int("v", 0, "log verbosity")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prefix, args) }, funcr.Options{Verbosity: *verbose})
	if *concurrency < 1 {
		log.Error(nil, "--concurrency must be >= 1")
		return 2
	}
	if *tokens < 0 {
		log.Error(nil, "--tokens must be >= 0")
		return 2
	}
	rng := newLockedRand(*seed)
	d, err := parseServiceTime(*dist, rng)
	if err == nil {
		tok.output, err = parseOutputTokens(*outputTokens, rng)
	}
	if err == nil {
		err = tok.validate()
	}
	if err != nil {
		log.Error(err, "bad flag")
		return 2
	}
	s := &server{
		model: *model, tokens: *tokens, tenantHeader: *tenantHeader, dist: d, tok: tok,
		slots: newSlots(*concurrency), stats: newStats(), log: log, maxBodyBytes: 16 << 20,
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error(err, "listen")
		return 1
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("simserver (a stand-in for vLLM) serving", "addr", ln.Addr().String(), "concurrency", *concurrency, "serviceTime", d.String())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		log.Error(err, "serve")
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	return 0
}
