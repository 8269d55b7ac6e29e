package fleet

import "flag"

// AddFlags defines the dispatcher's fleet-mode flags on fs, writing into c:
// --state, --redis-password-file, --redis-ca-file, --state-lease-ttl and
// --state-renew-interval.
func AddFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.URL, "state", stateLocal, `shared state: "local", or a URL such as redis://host:6379 (fleet mode)`)
	fs.StringVar(&c.PasswordFile, "redis-password-file", "", "file holding the Redis password for --state=redis://… (fleet mode)")
	fs.StringVar(&c.CAFile, "redis-ca-file", "", "PEM certificates to trust for --state=rediss://… instead of the system roots")
	fs.DurationVar(&c.LeaseTTL, "state-lease-ttl", defaultLeaseTTL, "fleet mode: how long a slot or queued place outlives its last renewal; a crashed dispatcher's capacity returns within it")
	fs.DurationVar(&c.RenewInterval, "state-renew-interval", 0, "fleet mode: how often a dispatcher renews all its leases in one batch, at most half of --state-lease-ttl (0: 3s, or a third of the TTL when that is shorter)")
}
