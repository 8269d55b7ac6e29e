package state

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// Flags are the dispatcher flags of fleet mode besides --state.
type Flags struct {
	PasswordFile  string
	CAFile        string
	LeaseTTL      time.Duration
	RenewInterval time.Duration
}

// AddFlags defines --redis-password-file, --redis-ca-file,
// --state-lease-ttl and --state-renew-interval on fs.
func AddFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.PasswordFile, "redis-password-file", "", "file holding the Redis password for --state=redis://… (fleet mode)")
	fs.StringVar(&f.CAFile, "redis-ca-file", "", "PEM certificates to trust for --state=rediss://… instead of the system roots")
	fs.DurationVar(&f.LeaseTTL, "state-lease-ttl", DefaultLeaseTTL, "fleet mode: how long a slot or queued place outlives its last renewal; a crashed dispatcher's capacity returns within it")
	fs.DurationVar(&f.RenewInterval, "state-renew-interval", 0, "fleet mode: how often a dispatcher renews all its leases in one batch, at most half of --state-lease-ttl (0: 3s, or a third of the TTL when that is shorter)")
	return f
}

type flagsKey struct{}

// WithFlags attaches f to ctx for Open.
func WithFlags(ctx context.Context, f *Flags) context.Context {
	return context.WithValue(ctx, flagsKey{}, f)
}

// Open is a dispatcher.StateOpener for the schemes redis and rediss: it
// builds the Gate from stateURL and the Flags attached with WithFlags
// (defaults without), and starts it with kick as the wake-up. The Gate is
// also the io.Closer, a prometheus.Collector of the tiergate_state_*
// metrics and a dispatcher.PolicyObserver.
func Open(ctx context.Context, stateURL string, kick func(), log logr.Logger) (queue.Gate, io.Closer, error) {
	cfg := Config{URL: stateURL}
	if f, ok := ctx.Value(flagsKey{}).(*Flags); ok && f != nil {
		cfg.PasswordFile, cfg.CAFile, cfg.LeaseTTL, cfg.RenewInterval = f.PasswordFile, f.CAFile, f.LeaseTTL, f.RenewInterval
	}
	g, err := New(cfg, WithLogger(log))
	if err != nil {
		return nil, nil, err
	}
	g.Start(kick)
	return g, g, nil
}

var _ prometheus.Collector = (*Redis)(nil)

// Describe implements prometheus.Collector: the tiergate_state_* metrics.
func (g *Redis) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range g.m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (g *Redis) Collect(ch chan<- prometheus.Metric) {
	for _, c := range g.m.collectors() {
		c.Collect(ch)
	}
}
