package v1

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// SchemaVersion is the newest revision of the Policy schema this build
// reads and writes. Revision 0 is the document before it named its
// schema (no schemaVersion field); revision 1 adds schemaVersion itself;
// revision 2 the token budgets (tokens, tiers[].tenantLimits,
// tenants[].limits); revision 3 fairness and token bounds (fairness,
// tokenServiceRate, tiers[].queueTokenBound, tiers[].tenantQueueTokenLimit,
// tenants[].weight).
const SchemaVersion = 3

// SchemaHeader is the admin API's response header that carries the
// dispatcher's SchemaVersion, on every answer, errors included, so the
// controller learns a dispatcher's revision from any push. A dispatcher
// that does not send it is at revision 0.
const SchemaHeader = "Tiergate-Policy-Schema"

// ErrUnsupportedSchema is wrapped by a *SchemaError: the document names a
// schemaVersion newer than SchemaVersion. The admin API answers it with
// 400 unsupported_schema.
var ErrUnsupportedSchema = errors.New("policy: unsupported schema version")

// SchemaError refuses a document of a newer schema revision than this
// build knows. It is reported before any unknown field: the fields such a
// document carries are not typos but the newer revision's.
type SchemaError struct {
	// Got is the document's schemaVersion.
	Got int
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("schemaVersion %d is newer than %d, the newest this build understands", e.Got, SchemaVersion)
}

func (e *SchemaError) Unwrap() error { return ErrUnsupportedSchema }

// checkSchema peeks at the schemaVersion of js, a JSON document, before
// the strict decode. A value that is not an integer is left to the strict
// decode to report.
func checkSchema(js []byte) error {
	var head struct {
		SchemaVersion int `json:"schemaVersion"`
	}
	if json.Unmarshal(js, &head) != nil {
		return nil
	}
	if head.SchemaVersion > SchemaVersion {
		return &SchemaError{Got: head.SchemaVersion}
	}
	return nil
}

// A Field is a part of the Policy schema added after revision 1: a field
// a dispatcher of an older revision refuses as unknown. Every such field
// must be optional (omitempty), so that cleared it is absent.
type Field struct {
	// Name is the field's JSON path, with [] for the elements of a list:
	// "tokens", "tiers[].tenantLimits".
	Name string
	// Since is the revision that introduced the field (>= 2).
	Since int
	// InUse says whether p sets the field.
	InUse func(p *Policy) bool
	// Clear removes the field from p, a shallow copy of the caller's
	// policy: it must copy any slice or pointer it changes, not write
	// through it.
	Clear func(p *Policy)
}

// registry lists Fields oldest first.
type registry []Field

// fields is the registry of this build; TestSchemaFieldsAreRegistered
// fails on a Policy field that is neither in revision 0 nor here.
var fields = registry{
	{
		Name: "tokens", Since: 2,
		InUse: func(p *Policy) bool { return p.Tokens != nil },
		Clear: func(p *Policy) { p.Tokens = nil },
	},
	tierField("tiers[].tenantLimits", 2, func(t *Tier) bool { return t.TenantLimits != nil }, func(t *Tier) { t.TenantLimits = nil }),
	tenantField("tenants[].limits", 2, func(t *Tenant) bool { return t.Limits != nil }, func(t *Tenant) { t.Limits = nil }),
	{
		Name: "fairness", Since: 3,
		InUse: func(p *Policy) bool { return p.Fairness != nil },
		Clear: func(p *Policy) { p.Fairness = nil },
	},
	{
		Name: "tokenServiceRate", Since: 3,
		InUse: func(p *Policy) bool { return p.TokenServiceRate != 0 },
		Clear: func(p *Policy) { p.TokenServiceRate = 0 },
	},
	tierField("tiers[].queueTokenBound", 3, func(t *Tier) bool { return t.QueueTokenBound != 0 }, func(t *Tier) { t.QueueTokenBound = 0 }),
	tierField("tiers[].tenantQueueTokenLimit", 3, func(t *Tier) bool { return t.TenantQueueTokenLimit != 0 }, func(t *Tier) { t.TenantQueueTokenLimit = 0 }),
	tenantField("tenants[].weight", 3, func(t *Tenant) bool { return t.Weight != 0 }, func(t *Tenant) { t.Weight = 0 }),
}

// tierField is a Field of every element of tiers[].
func tierField(name string, since int, inUse func(*Tier) bool, clear func(*Tier)) Field {
	return listField(name, since, func(p *Policy) *[]Tier { return &p.Tiers }, inUse, clear)
}

// tenantField is a Field of every element of tenants[].
func tenantField(name string, since int, inUse func(*Tenant) bool, clear func(*Tenant)) Field {
	return listField(name, since, func(p *Policy) *[]Tenant { return &p.Tenants }, inUse, clear)
}

// listField is a Field of every element of the list that list points to:
// in use when any element sets it, cleared in a copy of the list so the
// caller's elements stay as they were.
func listField[E any](name string, since int, list func(*Policy) *[]E, inUse func(*E) bool, clear func(*E)) Field {
	return Field{
		Name: name, Since: since,
		InUse: func(p *Policy) bool {
			l := *list(p)
			for i := range l {
				if inUse(&l[i]) {
					return true
				}
			}
			return false
		},
		Clear: func(p *Policy) {
			l := slices.Clone(*list(p))
			for i := range l {
				clear(&l[i])
			}
			*list(p) = l
		},
	}
}

// At returns p as a dispatcher of revision rev understands it: every
// field newer than rev cleared and SchemaVersion set to rev (so omitted at
// 0), with the names of the cleared fields that p used, which that
// dispatcher cannot enforce. rev is clamped to [0, SchemaVersion]: a newer
// dispatcher reads this build's revision. p is not changed.
func (p Policy) At(rev int) (Policy, []string) {
	return fields.at(p, rev, SchemaVersion)
}

// at is At for a schema whose newest revision is newest.
func (r registry) at(p Policy, rev, newest int) (Policy, []string) {
	rev = max(0, min(rev, newest))
	var dropped []string
	for _, f := range r {
		if f.Since <= rev || !f.InUse(&p) {
			continue
		}
		dropped = append(dropped, f.Name)
		f.Clear(&p)
	}
	p.SchemaVersion = rev
	return p, dropped
}

// check reports a malformed registry of a schema whose newest revision is
// newest: a field without its functions, of a revision the schema does
// not have, listed twice or out of order.
func (r registry) check(newest int) error {
	seen := map[string]bool{}
	for i, f := range r {
		switch {
		case f.Name == "" || f.InUse == nil || f.Clear == nil:
			return fmt.Errorf("policy schema: field %d (%q) lacks a name, InUse or Clear", i, f.Name)
		case f.Since < 2 || f.Since > newest:
			return fmt.Errorf("policy schema: field %q: since revision %d, want 2..%d", f.Name, f.Since, newest)
		case seen[f.Name]:
			return fmt.Errorf("policy schema: field %q is listed twice", f.Name)
		case i > 0 && f.Since < r[i-1].Since:
			return fmt.Errorf("policy schema: field %q (revision %d) is listed after one of revision %d", f.Name, f.Since, r[i-1].Since)
		}
		seen[f.Name] = true
	}
	return nil
}
