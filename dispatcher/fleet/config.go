package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// stateLocal is the --state value of local mode: no shared state, no Gate.
const stateLocal = "local"

// Defaults of the flags.
const (
	// defaultLeaseTTL is how long a lease outlives its last renewal: the
	// longest a crashed dispatcher's capacity stays taken.
	defaultLeaseTTL = 10 * time.Second
	// defaultRenewInterval is how often a dispatcher renews all its leases
	// in one batch. At most half the TTL, so one late renewal loses nothing.
	defaultRenewInterval = 3 * time.Second
	// defaultOpTimeout bounds one Redis round trip on the dispatch path.
	// Past it the dispatcher falls back to its local slice.
	defaultOpTimeout = 250 * time.Millisecond
	// defaultHandoffHold is how long a slot handed to a starved dispatcher
	// waits for it: a pub/sub wake-up and one exchange take milliseconds,
	// and an unclaimed hold idles its slot at most this long.
	defaultHandoffHold = 250 * time.Millisecond
)

// errInvalidConfig wraps every configuration error.
var errInvalidConfig = errors.New("fleet: invalid configuration")

// Config is what the dispatcher's flags say about shared state. Start from
// the zero value (every zero field takes its default) and set what the
// flags gave.
type Config struct {
	// URL is --state: redis://[user[:password]@]host[:port][/db] or
	// rediss://… for TLS. For Redis Cluster add ?cluster=true (and more
	// seed nodes as &addr=host:port). Other query parameters are go-redis
	// options; the timeouts and retries are fixed by the Gate.
	URL string
	// PasswordFile is --redis-password-file: a file whose content (one
	// trailing newline trimmed) is the Redis password. It may not be
	// combined with a password in URL.
	PasswordFile string
	// CAFile is --redis-ca-file: PEM certificates to trust for rediss://
	// instead of the system roots (a private CA).
	CAFile string
	// LeaseTTL is --state-lease-ttl.
	LeaseTTL time.Duration
	// RenewInterval is --state-renew-interval; at most LeaseTTL/2.
	RenewInterval time.Duration
	// OpTimeout bounds one Redis call made on the dispatch path.
	OpTimeout time.Duration
	// RecheckInterval bounds how long a dispatcher whose queue the fleet
	// has blocked waits without a wake-up before it asks again; it covers
	// lost pub/sub messages. Defaults to RenewInterval.
	RecheckInterval time.Duration
	// HandoffHold is how long a slot freed while another dispatcher was
	// starved stays held for that dispatcher (docs/fleet.md, "Fair
	// hand-off"). A starved dispatcher stays one for 2 × RecheckInterval
	// after its last refusal.
	HandoffHold time.Duration
	// DispatcherID names this dispatcher in lease members; defaults to the
	// host name plus a random suffix, so a restarted pod is a new owner.
	DispatcherID string
}

// IsLocal reports whether a --state value selects local mode.
func IsLocal(state string) bool {
	return state == "" || strings.EqualFold(state, stateLocal)
}

func (c *Config) defaults() {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = defaultLeaseTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = defaultRenewInterval
		if c.RenewInterval > c.LeaseTTL/2 {
			c.RenewInterval = c.LeaseTTL / 3
		}
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = defaultOpTimeout
	}
	if c.RecheckInterval == 0 {
		c.RecheckInterval = c.RenewInterval
	}
	if c.HandoffHold == 0 {
		c.HandoffHold = defaultHandoffHold
	}
}

func (c *Config) validate() error {
	u, err := url.Parse(c.URL)
	switch {
	case IsLocal(c.URL):
		return fmt.Errorf("%w: --state is %q: local mode needs no shared state", errInvalidConfig, c.URL)
	case err != nil:
		return fmt.Errorf("%w: --state: %v", errInvalidConfig, err)
	case u.Scheme != "redis" && u.Scheme != "rediss":
		return fmt.Errorf("%w: --state %q: want %q, redis://host:port/db or rediss://host:port/db", errInvalidConfig, redactURL(c.URL), stateLocal)
	case u.Host == "":
		return fmt.Errorf("%w: --state %q: no host", errInvalidConfig, redactURL(c.URL))
	case c.LeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: --state-lease-ttl %s: want at least 100ms", errInvalidConfig, c.LeaseTTL)
	case c.RenewInterval <= 0:
		return fmt.Errorf("%w: --state-renew-interval %s: want more than 0", errInvalidConfig, c.RenewInterval)
	case c.RenewInterval > c.LeaseTTL/2:
		return fmt.Errorf("%w: --state-renew-interval %s: want at most half of --state-lease-ttl %s", errInvalidConfig, c.RenewInterval, c.LeaseTTL)
	case c.OpTimeout <= 0:
		return fmt.Errorf("%w: op timeout %s: want more than 0", errInvalidConfig, c.OpTimeout)
	case c.RecheckInterval <= 0:
		return fmt.Errorf("%w: recheck interval %s: want more than 0", errInvalidConfig, c.RecheckInterval)
	case c.HandoffHold < time.Millisecond:
		return fmt.Errorf("%w: hand-off hold %s: want at least 1ms", errInvalidConfig, c.HandoffHold)
	}
	if c.CAFile != "" && u.Scheme != "rediss" {
		return fmt.Errorf("%w: --redis-ca-file is set but --state is not rediss://", errInvalidConfig)
	}
	if _, pw := u.User.Password(); pw && c.PasswordFile != "" {
		return fmt.Errorf("%w: --state carries a password and --redis-password-file is set: give one", errInvalidConfig)
	}
	return nil
}

// clusterURL reports whether the URL asks for Redis Cluster (?cluster=true,
// or more seed nodes in ?addr=) and returns it without the cluster
// parameter, as go-redis expects it.
func clusterURL(raw string) (bool, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return false, raw, err
	}
	q := u.Query()
	cluster := len(q["addr"]) > 0
	if v, ok := q["cluster"]; ok {
		b, err := strconv.ParseBool(v[len(v)-1])
		if err != nil {
			return false, raw, fmt.Errorf("cluster=%q: want true or false", v[len(v)-1])
		}
		cluster = cluster || b
		q.Del("cluster")
		u.RawQuery = q.Encode()
	}
	return cluster, u.String(), nil
}

// newClient connects nothing yet: a Redis Cluster client when the URL asks
// for one, else a single-node client. Calls on the dispatch path must fail
// fast rather than stall the queue, so the Gate's timeouts replace go-redis's
// defaults and retries are off.
func (c *Config) newClient() (redis.UniversalClient, error) {
	cluster, raw, err := clusterURL(c.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: --state %q: %v", errInvalidConfig, redactURL(c.URL), err)
	}
	if !cluster {
		o, err := c.redisOptions()
		if err != nil {
			return nil, err
		}
		return redis.NewClient(o), nil
	}
	if u, _ := url.Parse(raw); strings.Trim(u.Path, "/") != "" && strings.Trim(u.Path, "/") != "0" {
		return nil, fmt.Errorf("%w: --state %q: Redis Cluster has only database 0", errInvalidConfig, redactURL(c.URL))
	}
	o, err := redis.ParseClusterURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: --state %q: %v", errInvalidConfig, redactURL(c.URL), err)
	}
	pw, tc, err := c.secrets(o.TLSConfig)
	if err != nil {
		return nil, err
	}
	if pw != "" {
		o.Password = pw
	}
	o.TLSConfig = tc
	o.DialTimeout, o.DialerRetries = c.OpTimeout, 1
	o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = c.OpTimeout, c.OpTimeout, c.OpTimeout
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.MaintNotificationsConfig = noMaintNotifications()
	return redis.NewClusterClient(o), nil
}

// redisOptions are the single-node client's options.
func (c *Config) redisOptions() (*redis.Options, error) {
	o, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: --state %q: %v", errInvalidConfig, redactURL(c.URL), err)
	}
	pw, tc, err := c.secrets(o.TLSConfig)
	if err != nil {
		return nil, err
	}
	if pw != "" {
		o.Password = pw
	}
	o.TLSConfig = tc
	o.DialTimeout, o.DialerRetries = c.OpTimeout, 1
	o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = c.OpTimeout, c.OpTimeout, c.OpTimeout
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.MaintNotificationsConfig = noMaintNotifications()
	return o, nil
}

// noMaintNotifications turns off go-redis's maintenance notifications,
// which would start goroutines and a handshake the Gate has no use for.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// secrets reads the password file and completes the TLS configuration
// go-redis derived from the URL (nil for redis://) with the CA file.
func (c *Config) secrets(fromURL *tls.Config) (string, *tls.Config, error) {
	pw := ""
	if c.PasswordFile != "" {
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return "", nil, fmt.Errorf("%w: --redis-password-file: %v", errInvalidConfig, err)
		}
		pw = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if pw == "" {
			return "", nil, fmt.Errorf("%w: --redis-password-file %s is empty", errInvalidConfig, c.PasswordFile)
		}
	}
	tc := fromURL
	if tc == nil {
		return pw, nil, nil
	}
	tc.MinVersion = tls.VersionTLS12
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return "", nil, fmt.Errorf("%w: --redis-ca-file: %v", errInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return "", nil, fmt.Errorf("%w: --redis-ca-file %s holds no PEM certificate", errInvalidConfig, c.CAFile)
		}
		tc.RootCAs = pool
	}
	return pw, tc, nil
}

// redactURL hides a password in a URL for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); ok {
		return u.Redacted()
	}
	return s
}
