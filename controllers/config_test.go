package controllers

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		change func(*Config)
		want   string
	}{
		"the defaults are valid": {func(*Config) {}, ""},
		"a token Secret":         {func(c *Config) { c.PushTokenSecret = types.NamespacedName{Namespace: "ns", Name: "tok"} }, ""},
		"a Prometheus address":   {func(c *Config) { c.PrometheusAddress = "https://prom.monitoring:9091" }, ""},
		"zero resync":            {func(c *Config) { c.ResyncPeriod = 0 }, "invalid controller options: resync period 0s must be positive"},
		"negative completions": {func(c *Config) { c.MeasuredMinCompletions = -1 },
			"invalid controller options: measured min completions -1 must not be negative"},
		"tolerance of 1":      {func(c *Config) { c.MeasuredTolerance = 1 }, "invalid controller options: measured tolerance 1 must be in [0, 1)"},
		"negative tolerance":  {func(c *Config) { c.MeasuredTolerance = -0.1 }, "invalid controller options: measured tolerance -0.1 must be in [0, 1)"},
		"zero strike":         {func(c *Config) { c.UnreachableStrike = 0 }, "invalid controller options: unreachable strike 0 must be at least 1"},
		"no reconcile worker": {func(c *Config) { c.MaxConcurrentReconciles = 0 }, "invalid controller options: max concurrent reconciles 0 must be at least 1"},
		"zero token Secret interval": {func(c *Config) { c.PushTokenSecretInterval = 0 },
			"invalid controller options: push token Secret interval 0s must be positive"},
		"no token Secret key": {func(c *Config) { c.PushTokenSecretKey = "" }, "invalid controller options: push token Secret key must not be empty"},
		"a token Secret without a namespace": {func(c *Config) { c.PushTokenSecret = types.NamespacedName{Name: "tok"} },
			`invalid controller options: push token Secret "/tok" needs both a namespace and a name`},
		"a token Secret without a name": {func(c *Config) { c.PushTokenSecret = types.NamespacedName{Namespace: "ns"} },
			`invalid controller options: push token Secret "ns/" needs both a namespace and a name`},
		"Prometheus without a scheme": {func(c *Config) { c.PrometheusAddress = "prometheus:9090" },
			`invalid controller options: Prometheus address "prometheus:9090" must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090`},
		"Prometheus over ftp": {func(c *Config) { c.PrometheusAddress = "ftp://prometheus:9090" },
			`invalid controller options: Prometheus address "ftp://prometheus:9090" must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090`},
		"Prometheus with no host": {func(c *Config) { c.PrometheusAddress = "http://:9090" },
			`invalid controller options: Prometheus address "http://:9090" must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090`},
		// The sub-options' rules, applied through the configuration.
		"negative push timeout": {func(c *Config) { c.PushTimeout = -time.Second }, "invalid controller options: push timeout -1s must be positive"},
		"zero push timeout":     {func(c *Config) { c.PushTimeout = 0 }, "invalid controller options: push timeout 0s must be positive"},
		"no push worker":        {func(c *Config) { c.PushWorkers = 0 }, "invalid controller options: push workers 0 must be at least 1"},
		"backoff base over max": {func(c *Config) { c.BackoffBase, c.BackoffMax = time.Second, time.Millisecond },
			"invalid controller options: push backoff 1s..1ms must be positive, base <= max"},
		"zero backoff base": {func(c *Config) { c.BackoffBase = 0 }, "invalid controller options: push backoff 0s..5s must be positive, base <= max"},
		"zero JWKS min refetch": {func(c *Config) { c.JWKSMinRefetch = 0 },
			"invalid controller options: JWKS min refetch 0s and timeout 10s must be positive"},
		"negative JWKS timeout": {func(c *Config) { c.JWKSTimeout = -time.Second },
			"invalid controller options: JWKS min refetch 30s and timeout -1s must be positive"},
		"no clock": {func(c *Config) { c.Clock = nil }, "invalid controller options: the Pusher needs a clock"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			tc.change(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidOptions) || err.Error() != tc.want {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

// The sub-options are the configuration's values, and their constructors
// refuse what they are not given instead of defaulting it.
func TestConfigDerivesTheSubOptions(t *testing.T) {
	c := DefaultConfig()
	c.PushTokenFile, c.JWKSCAFile = "/var/run/token", "/etc/ca.pem"
	p := c.pusherOptions()
	got := []any{p.TokenFile, p.Timeout, p.Workers, p.BackoffBase, p.BackoffMax, p.Clock != nil}
	want := []any{"/var/run/token", 5 * time.Second, 16, 250 * time.Millisecond, 5 * time.Second, true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pusher options (-want +got):\n%s", diff)
	}
	j := c.jwksOptions()
	got = []any{j.CAFile, j.MinRefetch, j.Timeout, j.Clock != nil}
	want = []any{"/etc/ca.pem", 30 * time.Second, 10 * time.Second, true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("JWKS options (-want +got):\n%s", diff)
	}
	if _, err := NewPusher(PusherOptions{}); err == nil || err.Error() != "invalid controller options: push timeout 0s must be positive" {
		t.Errorf("NewPusher of zero options: %v", err)
	}
	if _, err := NewJWKSFetcher(JWKSFetcherOptions{}); err == nil || err.Error() != "invalid controller options: JWKS min refetch 0s and timeout 0s must be positive" {
		t.Errorf("NewJWKSFetcher of zero options: %v", err)
	}
	noClock := c.jwksOptions()
	noClock.Clock = nil
	if _, err := NewJWKSFetcher(noClock); err == nil || err.Error() != "invalid controller options: the JWKS fetcher needs a clock" {
		t.Errorf("NewJWKSFetcher without a clock: %v", err)
	}
}
