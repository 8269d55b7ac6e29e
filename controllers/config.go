package controllers

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Config is the configuration of the controllers: the one place of their
// defaults (DefaultConfig, from which the flags of `tiergate controller`
// take theirs) and of their validation (Validate, which applies the rules
// of the sub-options it derives). The Pusher's and the JWKS fetcher's
// options are derived from it; their constructors default nothing.
type Config struct {
	// PushTokenFile holds the bearer token sent with every push; it is
	// followed as the kubelet rotates the mounted Secret.
	PushTokenFile string
	// PushTokenSecret, when named, is the push token Secret the controller
	// creates with a random token under PushTokenSecretKey when it is
	// missing; its token serves until PushTokenFile exists. Checked every
	// PushTokenSecretInterval.
	PushTokenSecret         types.NamespacedName
	PushTokenSecretKey      string
	PushTokenSecretInterval time.Duration
	// PushTimeout bounds one push.
	PushTimeout time.Duration
	// PushWorkers bounds how many pushes run at once.
	PushWorkers int
	// BackoffBase and BackoffMax bound the retry delay of failed pushes,
	// which doubles per consecutive failure of a pod.
	BackoffBase, BackoffMax time.Duration
	// ResyncPeriod re-pushes to every dispatcher even when it is current.
	// It also paces how often measured stats arrive.
	ResyncPeriod time.Duration
	// MeasuredMinCompletions and MeasuredTolerance are the hysteresis of
	// serviceTime.source Measured.
	MeasuredMinCompletions int64
	MeasuredTolerance      float64
	// UnreachableStrike is how many consecutive failed pushes make an
	// unreachable pod degrade its pool.
	UnreachableStrike int
	// PrometheusAddress is the Prometheus server a ScaledObject reads from
	// when its pool's spec.autoscaling.prometheus.serverAddress is empty.
	PrometheusAddress string
	// MaxConcurrentReconciles of the pool controller.
	MaxConcurrentReconciles int
	// JWKSCAFile, when set, is a PEM bundle trusted besides the system
	// roots for JWKS URLs.
	JWKSCAFile string
	// JWKSMinRefetch is the shortest time between two fetches of one JWKS
	// URL that an unknown key ID or a failure asks for; JWKSTimeout bounds
	// one fetch.
	JWKSMinRefetch, JWKSTimeout time.Duration
	// Clock drives every timer of the controllers.
	Clock clock.WithTicker
}

// DefaultConfig is the configuration with every default.
func DefaultConfig() Config {
	return Config{
		PushTokenSecretKey:      "token",
		PushTokenSecretInterval: 30 * time.Second,
		PushTimeout:             5 * time.Second,
		PushWorkers:             16,
		// A dispatcher that starts late must not wait long for its policy.
		BackoffBase:             250 * time.Millisecond,
		BackoffMax:              5 * time.Second,
		ResyncPeriod:            30 * time.Second,
		MeasuredMinCompletions:  defaultMeasuredMinCompletions,
		MeasuredTolerance:       defaultMeasuredTolerance,
		UnreachableStrike:       3,
		MaxConcurrentReconciles: 4,
		JWKSMinRefetch:          30 * time.Second,
		JWKSTimeout:             10 * time.Second,
		Clock:                   clock.RealClock{},
	}
}

// ErrInvalidOptions is wrapped by every configuration error.
var ErrInvalidOptions = errors.New("invalid controller options")

// Validate checks the configuration, the derived options included.
func (c Config) Validate() error {
	switch {
	case c.ResyncPeriod <= 0:
		return fmt.Errorf("%w: resync period %s must be positive", ErrInvalidOptions, c.ResyncPeriod)
	case c.MeasuredMinCompletions < 0:
		return fmt.Errorf("%w: measured min completions %d must not be negative", ErrInvalidOptions, c.MeasuredMinCompletions)
	case c.MeasuredTolerance < 0 || c.MeasuredTolerance >= 1:
		return fmt.Errorf("%w: measured tolerance %v must be in [0, 1)", ErrInvalidOptions, c.MeasuredTolerance)
	case c.UnreachableStrike < 1:
		return fmt.Errorf("%w: unreachable strike %d must be at least 1", ErrInvalidOptions, c.UnreachableStrike)
	case c.MaxConcurrentReconciles < 1:
		return fmt.Errorf("%w: max concurrent reconciles %d must be at least 1", ErrInvalidOptions, c.MaxConcurrentReconciles)
	case c.PushTokenSecretInterval <= 0:
		return fmt.Errorf("%w: push token Secret interval %s must be positive", ErrInvalidOptions, c.PushTokenSecretInterval)
	case c.PushTokenSecretKey == "":
		return fmt.Errorf("%w: push token Secret key must not be empty", ErrInvalidOptions)
	case (c.PushTokenSecret.Name == "") != (c.PushTokenSecret.Namespace == ""):
		return fmt.Errorf("%w: push token Secret %q needs both a namespace and a name", ErrInvalidOptions, c.PushTokenSecret.String())
	}
	if msg := checkPrometheusAddress(c.PrometheusAddress); msg != "" {
		return fmt.Errorf("%w: Prometheus address %q %s", ErrInvalidOptions, c.PrometheusAddress, msg)
	}
	if err := c.pusherOptions().validate(); err != nil {
		return err
	}
	return c.jwksOptions().validate()
}

// checkPrometheusAddress says what is wrong with a Prometheus address, ""
// when nothing is: the CRD holds a pool's own address to the same rule.
func checkPrometheusAddress(a string) string {
	if a == "" {
		return ""
	}
	u, err := url.Parse(a)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return "must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090"
	}
	return ""
}

// pusherOptions are the Pusher's options; Setup adds the token source,
// Notify and Log.
func (c Config) pusherOptions() PusherOptions {
	return PusherOptions{
		TokenFile: c.PushTokenFile, Timeout: c.PushTimeout, Workers: c.PushWorkers,
		BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax, Clock: c.Clock,
	}
}

// jwksOptions are the JWKS fetcher's options; Setup adds Notify and Log.
func (c Config) jwksOptions() JWKSFetcherOptions {
	return JWKSFetcherOptions{CAFile: c.JWKSCAFile, MinRefetch: c.JWKSMinRefetch, Timeout: c.JWKSTimeout, Clock: c.Clock}
}
