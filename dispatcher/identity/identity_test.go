package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

func hash(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

func pol(mode, defaultTier string) *policy.Policy {
	return &policy.Policy{
		Authentication: policy.Authentication{Mode: mode, HeaderName: "X-Tenant-ID"},
		DefaultTier:    defaultTier,
		Tiers:          []policy.Tier{{Name: "premium"}, {Name: "free"}},
		Tenants: []policy.Tenant{
			{ID: "acme", Tier: "premium", APIKeySHA256: []string{hash("sk-acme-1"), hash("sk-acme-2")}},
			{ID: "bob", Tier: "free", APIKeySHA256: []string{hash("sk-bob")}},
		},
	}
}

func TestIdentify(t *testing.T) {
	tests := map[string]struct {
		mode, defaultTier string
		header            http.Header
		want              Identity
		wantErr           error
		wantMsg           string
		wantTenant        string // of the *Error
	}{
		"header: listed tenant gets its tier": {
			mode: policy.AuthTrustedHeader, header: http.Header{"X-Tenant-Id": {"acme"}},
			want: Identity{Tenant: "acme", Tier: "premium"}},
		"header: client cannot pick a tier": {
			mode: policy.AuthTrustedHeader, header: http.Header{"X-Tenant-Id": {"bob"}, "X-Tier": {"premium"}},
			want: Identity{Tenant: "bob", Tier: "free"}},
		"header: unknown tenant gets default tier": {
			mode: policy.AuthTrustedHeader, defaultTier: "free", header: http.Header{"X-Tenant-Id": {"carol"}},
			want: Identity{Tenant: "carol", Tier: "free"}},
		"header: unknown tenant without default tier": {
			mode: policy.AuthTrustedHeader, header: http.Header{"X-Tenant-Id": {"carol"}},
			want: Identity{Tenant: "carol"}, wantErr: ErrUnknownTenant, wantTenant: "carol",
			wantMsg: `unknown tenant: tenant "carol" is not known and the pool has no default tier`},
		"header: missing": {
			mode: policy.AuthTrustedHeader, header: http.Header{},
			wantErr: ErrUnauthenticated, wantMsg: "unauthenticated: missing the X-Tenant-ID header that names the tenant"},
		"header: empty": {
			mode: policy.AuthTrustedHeader, header: http.Header{"X-Tenant-Id": {""}},
			wantErr: ErrUnauthenticated, wantMsg: "unauthenticated: the X-Tenant-ID header is empty"},
		"header: repeated": {
			mode: policy.AuthTrustedHeader, header: http.Header{"X-Tenant-Id": {"acme", "bob"}},
			wantErr: ErrMalformed, wantMsg: "malformed credential: the X-Tenant-ID header is repeated 2 times; send it once"},
		"header: control character": {
			mode: policy.AuthTrustedHeader, header: http.Header{"X-Tenant-Id": {"ac me"}},
			wantErr: ErrMalformed, wantMsg: "malformed credential: the X-Tenant-ID header may hold only visible ASCII characters"},
		"key: first key": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"Bearer sk-acme-1"}},
			want: Identity{Tenant: "acme", Tier: "premium"}},
		"key: second key, lower-case scheme": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"bearer sk-acme-2"}},
			want: Identity{Tenant: "acme", Tier: "premium"}},
		"key: other tenant": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"Bearer sk-bob"}},
			want: Identity{Tenant: "bob", Tier: "free"}},
		"key: header tenant is ignored": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"Bearer sk-bob"}, "X-Tenant-Id": {"acme"}},
			want: Identity{Tenant: "bob", Tier: "free"}},
		"key: unknown key, even with a default tier": {
			mode: policy.AuthAPIKey, defaultTier: "free", header: http.Header{"Authorization": {"Bearer sk-nope"}},
			wantErr: ErrUnauthenticated, wantMsg: "unauthenticated: unknown API key"},
		"key: missing": {
			mode: policy.AuthAPIKey, header: http.Header{},
			wantErr: ErrUnauthenticated, wantMsg: `unauthenticated: missing API key; send "Authorization: Bearer <key>"`},
		"key: basic scheme": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"Basic YWNtZTp4"}},
			wantErr: ErrUnauthenticated, wantMsg: `unauthenticated: the Authorization header must be "Bearer <key>"`},
		"key: empty key": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"Bearer  "}},
			wantErr: ErrUnauthenticated, wantMsg: "unauthenticated: the Bearer key is empty"},
		"key: repeated": {
			mode: policy.AuthAPIKey, header: http.Header{"Authorization": {"Bearer sk-bob", "Bearer sk-acme-1"}},
			wantErr: ErrMalformed, wantMsg: "malformed credential: the Authorization header is repeated 2 times; send it once"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := New(pol(tc.mode, tc.defaultTier)).Identify(&http.Request{Header: tc.header, RemoteAddr: "192.0.2.7:40000"})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if err.Error() != tc.wantMsg {
					t.Errorf("message %q, want %q", err.Error(), tc.wantMsg)
				}
				var e *Error
				if !errors.As(err, &e) || !errors.Is(e.Kind, tc.wantErr) || e.Tenant != tc.wantTenant {
					t.Errorf("err %#v, want an *Error of kind %v for tenant %q", err, tc.wantErr, tc.wantTenant)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestStrip(t *testing.T) {
	tests := map[string]struct {
		mode string
		in   http.Header
		want http.Header
	}{
		"header mode": {
			mode: policy.AuthTrustedHeader,
			in:   http.Header{"X-Tenant-Id": {"acme"}, "Authorization": {"Bearer upstream"}, "X-Tiergate-Tenant": {"spoof"}, "X-Tier": {"premium"}},
			want: http.Header{"Authorization": {"Bearer upstream"}, "X-Tiergate-Tenant": {"acme"}},
		},
		"folded spellings": {
			mode: policy.AuthTrustedHeader,
			in: http.Header{"X_tenant_id": {"acme"}, "X_Tiergate_Tenant": {"spoof"}, "X-tiergate_TENANT": {"spoof"}, "X_tier": {"premium"},
				"X-Tiergate-Tenants": {"kept"}, "X_Trace": {"kept"}},
			want: http.Header{"X-Tiergate-Tenant": {"acme"}, "X-Tiergate-Tenants": {"kept"}, "X_Trace": {"kept"}},
		},
		"key mode": {
			mode: policy.AuthAPIKey,
			in:   http.Header{"Authorization": {"Bearer sk-acme-1"}, "X-Tiergate-Tenant": {"spoof"}, "Accept": {"text/event-stream"}},
			want: http.Header{"Accept": {"text/event-stream"}, "X-Tiergate-Tenant": {"acme"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			New(pol(tc.mode, "")).Strip(tc.in, "acme")
			if diff := cmp.Diff(tc.want, tc.in); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}
