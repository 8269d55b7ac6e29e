package identity

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// Sentinel errors, the Kind of an *Error; dispatcher/apierror maps them to
// 401, 403 and 400.
var (
	// ErrUnauthenticated: no credential, or one the policy does not know.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrUnknownTenant: a named tenant the policy does not list, and no default tier.
	ErrUnknownTenant = errors.New("unknown tenant")
	// ErrMalformed: the credential header is repeated or not well formed.
	ErrMalformed = errors.New("malformed credential")
)

// Error is a refused caller. Get it with errors.As; errors.Is(err, Kind)
// also works.
type Error struct {
	// Kind is ErrUnauthenticated, ErrUnknownTenant or ErrMalformed.
	Kind error
	// Reason says, for the client, what is wrong with the credential.
	Reason string
	// Tenant is the caller's tenant when it was named (ErrUnknownTenant).
	Tenant string
}

func (e *Error) Error() string { return e.Kind.Error() + ": " + e.Reason }

func (e *Error) Unwrap() error { return e.Kind }

func refuse(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Reason: fmt.Sprintf(format, args...)}
}

// TenantHeader is the header the dispatcher sets on every forwarded request
// to the tenant it resolved. Backends (and hack/simserver) may trust it
// because the dispatcher always deletes any client-sent copy first.
const TenantHeader = "X-Tiergate-Tenant"

// maxTenantLen bounds a tenant ID read from a header.
const maxTenantLen = 256

// Identity is a resolved caller.
type Identity struct {
	Tenant string
	Tier   string
}

// Identifier resolves callers under one policy.
type Identifier struct {
	mode        string
	header      string // canonical form, TrustedHeader mode
	headerName  string // as the policy spells it, for messages
	defaultTier string
	tierOf      map[string]string // tenant -> tier
	// sources are the trusted peers of TrustedHeader mode; none trusts all.
	sources []netip.Prefix
	// hashes and owners are parallel: every key hash and its tenant.
	hashes [][sha256.Size]byte
	owners []string
	// jwt checks tokens in JWT mode; nil otherwise.
	jwt *verifier
}

// Option configures New.
type Option func(*options)

type options struct {
	clock clock.PassiveClock
	prev  *Identifier
}

// WithClock sets the clock that token expiry is checked against (default
// the real one).
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.clock = c } }

// Reusing carries prev's cache of verified tokens and its unknown key IDs
// over when the new policy's JWT block (keys included) is the same, so a
// resync does not make every client's token be verified again.
func Reusing(prev *Identifier) Option { return func(o *options) { o.prev = prev } }

// New compiles an Identifier; p must be valid.
func New(p *policy.Policy, opts ...Option) *Identifier {
	o := options{clock: clock.RealClock{}}
	for _, f := range opts {
		f(&o)
	}
	id := &Identifier{
		mode:        p.Authentication.Mode,
		header:      http.CanonicalHeaderKey(p.Authentication.HeaderName),
		headerName:  p.Authentication.HeaderName,
		defaultTier: p.DefaultTier,
		tierOf:      make(map[string]string, len(p.Tenants)),
		sources:     policy.ParseTrustedSources(p.Authentication.TrustedSources),
	}
	if p.Authentication.Mode == policy.AuthJWT && p.Authentication.JWT != nil {
		var prev *verifier
		if o.prev != nil {
			prev = o.prev.jwt
		}
		id.jwt = newVerifier(p.Authentication.JWT, o.clock, prev)
	}
	for _, t := range p.Tenants {
		id.tierOf[t.ID] = t.Tier
		for _, h := range t.APIKeySHA256 {
			var sum [sha256.Size]byte
			if n, err := hex.Decode(sum[:], []byte(h)); err != nil || n != sha256.Size {
				continue // Validate refuses these; never match garbage.
			}
			id.hashes = append(id.hashes, sum)
			id.owners = append(id.owners, t.ID)
		}
	}
	return id
}

// Identify resolves the caller of r from its headers and, for trusted
// sources, its TCP peer (r.RemoteAddr, never a forwarded-for header). A
// refusal is an *Error.
func (id *Identifier) Identify(r *http.Request) (Identity, error) {
	var tenant string
	var err error
	switch id.mode {
	case policy.AuthAPIKey:
		tenant, err = id.byKey(r.Header)
	case policy.AuthJWT:
		tenant, err = id.byToken(r.Header)
	default:
		if err = id.fromTrustedSource(r.RemoteAddr); err == nil {
			tenant, err = id.byHeader(r.Header)
		}
	}
	if err != nil {
		return Identity{}, err
	}
	if tier, ok := id.tierOf[tenant]; ok {
		return Identity{Tenant: tenant, Tier: tier}, nil
	}
	if id.defaultTier != "" && id.mode != policy.AuthAPIKey {
		return Identity{Tenant: tenant, Tier: id.defaultTier}, nil
	}
	e := refuse(ErrUnknownTenant, "tenant %q is not known and the pool has no default tier", tenant)
	e.Tenant = tenant
	return Identity{Tenant: tenant}, e
}

func (id *Identifier) byHeader(h http.Header) (string, error) {
	vals := h[id.header]
	switch len(vals) {
	case 0:
		return "", refuse(ErrUnauthenticated, "missing the %s header that names the tenant", id.headerName)
	case 1:
	default:
		return "", refuse(ErrMalformed, "the %s header is repeated %d times; send it once", id.headerName, len(vals))
	}
	v := vals[0]
	if v == "" {
		return "", refuse(ErrUnauthenticated, "the %s header is empty", id.headerName)
	}
	if msg := badTenant(v); msg != "" {
		return "", refuse(ErrMalformed, "the %s header %s", id.headerName, msg)
	}
	return v, nil
}

// badTenant says what is wrong with a tenant ID, "" when nothing: it goes
// into a forwarded header and into messages.
func badTenant(v string) string {
	if len(v) > maxTenantLen {
		return fmt.Sprintf("is longer than %d bytes", maxTenantLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return "may hold only visible ASCII characters"
		}
	}
	return ""
}

// bearer is the credential of "Authorization: Bearer <what>".
func bearer(h http.Header, missing, what string) (string, error) {
	vals := h["Authorization"]
	switch len(vals) {
	case 0:
		return "", refuse(ErrUnauthenticated, "missing %s; send \"Authorization: Bearer <%s>\"", missing, what)
	case 1:
	default:
		return "", refuse(ErrMalformed, "the Authorization header is repeated %d times; send it once", len(vals))
	}
	scheme, cred, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", refuse(ErrUnauthenticated, "the Authorization header must be \"Bearer <%s>\"", what)
	}
	cred = strings.TrimSpace(cred)
	if cred == "" {
		return "", refuse(ErrUnauthenticated, "the Bearer %s is empty", what)
	}
	return cred, nil
}

func (id *Identifier) byKey(h http.Header) (string, error) {
	key, err := bearer(h, "API key", "key")
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(key))
	// Compare with every hash without stopping early, so the time taken
	// does not tell which key, or whether any, matched.
	match := -1
	for i := range id.hashes {
		if subtle.ConstantTimeCompare(sum[:], id.hashes[i][:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return "", refuse(ErrUnauthenticated, "unknown API key")
	}
	return id.owners[match], nil
}

// Strip removes the caller's credential and any client-sent tiergate
// header from h, then names the resolved tenant in TenantHeader. Every
// spelling of those headers that a CGI-style backend folds into them ('_'
// read as '-', any case) goes too, so none can pass for the real one.
func (id *Identifier) Strip(h http.Header, tenant string) {
	byBearer := id.mode == policy.AuthAPIKey || id.mode == policy.AuthJWT
	if byBearer {
		h.Del("Authorization")
	}
	for k := range h {
		if foldsTo(k, TenantHeader) || foldsTo(k, "X-Tier") || (!byBearer && foldsTo(k, id.header)) {
			delete(h, k)
		}
	}
	h[TenantHeader] = []string{tenant}
}

// foldsTo says whether field k is name once case is ignored and '_' is
// read as '-'. It allocates nothing.
func foldsTo(k, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := range len(k) {
		a, b := lower(k[i]), lower(name[i])
		if a == '_' {
			a = '-'
		}
		if b == '_' {
			b = '-'
		}
		if a != b {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
