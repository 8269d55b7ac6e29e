package identity_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/identity"
)

func headerPolicy(sources ...string) *policy.Policy {
	return &policy.Policy{
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID", TrustedSources: sources},
		DefaultTier:    "free",
		Tiers:          []policy.Tier{{Name: "premium"}, {Name: "free"}},
		Tenants:        []policy.Tenant{{ID: "acme", Tier: "premium"}},
	}
}

func TestTrustedSources(t *testing.T) {
	const outside = "the X-Tenant-ID header is believed only from the pool's trusted sources (authentication.trustedSources), and this connection comes from %s; send requests through the gateway"
	msg := func(peer string) *refusal { return unauth(fmt.Sprintf(outside, peer)) }
	acme := http.Header{"X-Tenant-Id": {"acme"}}
	tests := map[string]struct {
		sources []string
		peer    string
		header  http.Header
		want    *refusal // nil: acme, premium
	}{
		"no sources: any peer":     {peer: "192.0.2.7:40000", header: acme},
		"loopback peer":            {sources: []string{"127.0.0.0/8", "10.0.0.0/8"}, peer: "127.0.0.1:5000", header: acme},
		"peer in the second CIDR":  {sources: []string{"127.0.0.0/8", "10.0.0.0/8"}, peer: "10.1.2.3:5000", header: acme},
		"IPv4-mapped IPv6 peer":    {sources: []string{"10.0.0.0/8"}, peer: "[::ffff:10.1.2.3]:5000", header: acme},
		"IPv6 peer":                {sources: []string{"fd00::/8"}, peer: "[fd00::1]:5000", header: acme},
		"a single trusted address": {sources: []string{"127.0.0.1/32"}, peer: "127.0.0.1:1", header: acme},
		"peer outside":             {sources: []string{"127.0.0.1/32"}, peer: "127.0.0.2:5000", header: acme, want: msg("127.0.0.2")},
		"X-Forwarded-For is no proof": {sources: []string{"127.0.0.1/32"}, peer: "192.0.2.7:40000",
			header: http.Header{"X-Tenant-Id": {"acme"}, "X-Forwarded-For": {"127.0.0.1"}, "X-Real-Ip": {"127.0.0.1"}, "Forwarded": {"for=127.0.0.1"}},
			want:   msg("192.0.2.7")},
		"no header from outside":  {sources: []string{"10.0.0.0/8"}, peer: "192.0.2.7:1", header: http.Header{}, want: msg("192.0.2.7")},
		"zoned link-local peer":   {sources: []string{"fd00::/8"}, peer: "[fe80::1%eth0]:5000", header: acme, want: msg("fe80::1")},
		"IPv6 peer, IPv4 sources": {sources: []string{"127.0.0.0/8"}, peer: "[::1]:5000", header: acme, want: msg("::1")},
		"unreadable peer address": {sources: []string{"127.0.0.0/8"}, peer: "@", header: acme,
			want: unauth(`the X-Tenant-ID header is believed only from the pool's trusted sources, and this connection's source address "@" cannot be read`)},
		"a trusted peer still needs the header": {sources: []string{"127.0.0.0/8"}, peer: "127.0.0.1:1", header: http.Header{},
			want: unauth("missing the X-Tenant-ID header that names the tenant")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := identity.New(headerPolicy(tc.sources...)).Identify(&http.Request{Header: tc.header, RemoteAddr: tc.peer})
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if diff := cmp.Diff(identity.Identity{Tenant: "acme", Tier: "premium"}, got); diff != "" {
					t.Errorf("(-want +got)\n%s", diff)
				}
				return
			}
			if diff := cmp.Diff(*tc.want, refusalOf(err)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}
