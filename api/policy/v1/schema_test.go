package v1

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testFields is a registry of made-up revisions over fields that exist,
// so the paths of At that the real registry (empty until revision 2) does
// not reach yet are exercised: a field in use dropped, one unused dropped
// silently, one kept at its own revision, and a nested one copied rather
// than written through.
var testFields = registry{
	{
		Name: "coldStartSeconds", Since: 2,
		InUse: func(p *Policy) bool { return p.ColdStartSeconds != 0 },
		Clear: func(p *Policy) { p.ColdStartSeconds = 0 },
	},
	{
		Name: "tenants[].maxConcurrency", Since: 3,
		InUse: func(p *Policy) bool {
			return slices.ContainsFunc(p.Tenants, func(t Tenant) bool { return t.MaxConcurrency != 0 })
		},
		Clear: func(p *Policy) {
			p.Tenants = slices.Clone(p.Tenants)
			for i := range p.Tenants {
				p.Tenants[i].MaxConcurrency = 0
			}
		},
	},
}

func TestAt(t *testing.T) {
	// policy is a document of revision rev, with or without the two fields
	// of testFields in use.
	policy := func(rev int, cold, maxConc bool) Policy {
		p := Policy{SchemaVersion: rev, Version: 7, Pool: "ns/p",
			Tenants: []Tenant{{ID: "a", Tier: "x"}, {ID: "b", Tier: "x"}}}
		if cold {
			p.ColdStartSeconds = 30
		}
		if maxConc {
			p.Tenants[0].MaxConcurrency = 2
		}
		return p
	}
	both := []string{"coldStartSeconds", "tenants[].maxConcurrency"}
	tests := map[string]struct {
		in          Policy
		rev         int
		want        Policy
		wantDropped []string
	}{
		"newest: nothing dropped":                      {in: policy(3, true, true), rev: 3, want: policy(3, true, true)},
		"newer than the schema: clamped to the newest": {in: policy(3, true, true), rev: 9, want: policy(3, true, true)},
		"an older document is lifted to the revision":  {in: policy(0, true, true), rev: 3, want: policy(3, true, true)},
		"revision 2: the newer nested field dropped":   {in: policy(3, true, true), rev: 2, want: policy(2, true, false), wantDropped: both[1:]},
		"revision 1: both dropped, oldest first":       {in: policy(3, true, true), rev: 1, want: policy(1, false, false), wantDropped: both},
		"revision 0: schemaVersion omitted too":        {in: policy(3, true, true), rev: 0, want: policy(0, false, false), wantDropped: both},
		"below 0: revision 0":                          {in: policy(3, true, true), rev: -4, want: policy(0, false, false), wantDropped: both},
		"an unused newer field is not named":           {in: policy(3, false, true), rev: 1, want: policy(1, false, false), wantDropped: both[1:]},
		"nothing newer in use: nothing named":          {in: policy(3, false, false), rev: 0, want: policy(0, false, false)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := clonePolicy(t, tc.in)
			got, dropped := testFields.at(tc.in, tc.rev, 3)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantDropped, dropped); diff != "" {
				t.Errorf("dropped fields in use (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.in); diff != "" {
				t.Errorf("At wrote through to its input (-before +after):\n%s", diff)
			}
		})
	}
}

// clonePolicy is a deep copy, through JSON.
func clonePolicy(t *testing.T, p Policy) Policy {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var out Policy
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAtRealRegistry: this build's At sets the revision and omits it at
// 0; below revision 2 it clears the token budgets and settings
// (tokens, tiers[].tenantLimits, tenants[].limits), naming those in use,
// oldest first, without writing through the caller's slices.
func TestAtRealRegistry(t *testing.T) {
	all := []string{"tokens", "tiers[].tenantLimits", "tenants[].limits"}
	tests := map[string]struct {
		in          func(*Policy)
		rev         int
		want        func(*Policy)
		wantDropped []string
	}{
		"revision 2 keeps everything":         {rev: 2},
		"a newer dispatcher reads revision 2": {rev: 5},
		"revision 1 clears the three, in use": {rev: 1, want: clearBudgets, wantDropped: all},
		"revision 0 too":                      {rev: 0, want: clearBudgets, wantDropped: all},
		"below 0 is revision 0":               {rev: -1, want: clearBudgets, wantDropped: all},
		"only the fields in use are named": {rev: 1, in: func(p *Policy) { p.Tokens = nil; p.Tiers[0].TenantLimits = nil },
			want: clearBudgets, wantDropped: all[2:]},
		"one tenant with limits is enough to name them": {rev: 1, in: func(p *Policy) { p.Tokens = nil; p.Tiers[0].TenantLimits = nil; p.Tenants[0].Limits = nil },
			want: clearBudgets, wantDropped: all[2:]},
		"nothing of revision 2 in use: nothing named": {rev: 1, in: clearBudgets, want: clearBudgets},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := *budgetPolicy()
			p.Version, p.Pool = 3, "ns/p"
			p.Tenants = append(p.Tenants, Tenant{ID: "globex", Tier: "free", Limits: &Limits{RequestsPerMinute: 2}})
			if tc.in != nil {
				tc.in(&p)
			}
			want := clonePolicy(t, p)
			if tc.want != nil {
				tc.want(&want)
			}
			want.SchemaVersion = max(0, min(tc.rev, SchemaVersion))
			before := clonePolicy(t, p)
			got, dropped := p.At(tc.rev)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("At(%d) (-want +got):\n%s", tc.rev, diff)
			}
			if diff := cmp.Diff(tc.wantDropped, dropped); diff != "" {
				t.Errorf("At(%d) dropped (-want +got):\n%s", tc.rev, diff)
			}
			if diff := cmp.Diff(before, p); diff != "" {
				t.Errorf("At(%d) wrote through to the caller's policy (-before +after):\n%s", tc.rev, diff)
			}
			if got.SchemaVersion < 2 {
				if err := got.Validate(); err != nil {
					t.Errorf("At(%d) is invalid: %v", tc.rev, err)
				}
			}
		})
	}
	p := budgetPolicy()
	q, _ := p.At(0)
	b, err := json.Marshal(q)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"schemaVersion", "tokens", "tenantLimits", `"limits"`} {
		if strings.Contains(string(b), field) {
			t.Errorf("At(0) encodes %s, which a revision-0 dispatcher refuses: %s", field, b)
		}
	}
}

// clearBudgets removes every field of revision 2 from p, in place.
func clearBudgets(p *Policy) {
	p.Tokens = nil
	for i := range p.Tiers {
		p.Tiers[i].TenantLimits = nil
	}
	for i := range p.Tenants {
		p.Tenants[i].Limits = nil
	}
}

func TestRegistryCheck(t *testing.T) {
	in := func(*Policy) bool { return false }
	clear := func(*Policy) {}
	tests := map[string]struct {
		r    registry
		want string
	}{
		"this build's":       {r: fields},
		"the test registry":  {r: testFields},
		"no InUse":           {r: registry{{Name: "a", Since: 2, Clear: clear}}, want: `policy schema: field 0 ("a") lacks a name, InUse or Clear`},
		"no name":            {r: registry{{Since: 2, InUse: in, Clear: clear}}, want: `policy schema: field 0 ("") lacks a name, InUse or Clear`},
		"revision 1":         {r: registry{{Name: "a", Since: 1, InUse: in, Clear: clear}}, want: `policy schema: field "a": since revision 1, want 2..3`},
		"a revision too new": {r: registry{{Name: "a", Since: 4, InUse: in, Clear: clear}}, want: `policy schema: field "a": since revision 4, want 2..3`},
		"twice":              {r: registry{{Name: "a", Since: 2, InUse: in, Clear: clear}, {Name: "a", Since: 3, InUse: in, Clear: clear}}, want: `policy schema: field "a" is listed twice`},
		"newest first":       {r: registry{{Name: "a", Since: 3, InUse: in, Clear: clear}, {Name: "b", Since: 2, InUse: in, Clear: clear}}, want: `policy schema: field "b" (revision 2) is listed after one of revision 3`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			newest := 3
			if name == "this build's" {
				newest = SchemaVersion
			}
			got := ""
			if err := tc.r.check(newest); err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("check: got %q, want %q", got, tc.want)
			}
		})
	}
}

// jsonPaths lists the JSON field paths of type t, [] marking list
// elements, with whether each is omitempty: what a dispatcher built from
// t accepts.
func jsonPaths(t reflect.Type, prefix string, out map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out[path] = strings.Contains(opts, "omitempty")
		jsonPaths(f.Type, path, out)
	}
}

// TestSchemaFieldsAreRegistered holds the skew rule's premise: every
// Policy field is in revision 0 (testdata/schema-revision-0.txt, the
// fields of the document before it had a schemaVersion, frozen), is
// schemaVersion, or is in the registry, optional, so that At can clear
// it for an older dispatcher. A new field that is not registered fails
// here, before any dispatcher refuses it.
func TestSchemaFieldsAreRegistered(t *testing.T) {
	b, err := os.ReadFile("testdata/schema-revision-0.txt")
	if err != nil {
		t.Fatal(err)
	}
	rev0 := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "#") {
			rev0[l] = true
		}
	}
	paths := map[string]bool{}
	jsonPaths(reflect.TypeOf(Policy{}), "", paths)
	registered := map[string]bool{}
	for _, f := range fields {
		registered[f.Name] = true
	}
	var unregistered, notOptional, missing []string
	for p, omitempty := range paths {
		switch {
		case rev0[p]:
		case p == "schemaVersion" || registered[p]:
			if !omitempty {
				notOptional = append(notOptional, p)
			}
		case underRegistered(p, registered):
			// Part of a registered field: cleared with it.
		default:
			unregistered = append(unregistered, p)
		}
	}
	for p := range rev0 {
		if _, ok := paths[p]; !ok {
			missing = append(missing, p)
		}
	}
	for name, got := range map[string][]string{"newer than revision 0 and not registered": unregistered,
		"registered but not omitempty": notOptional, "of revision 0 but gone (a revision-0 document no longer decodes)": missing} {
		sort.Strings(got)
		if len(got) > 0 {
			t.Errorf("Policy fields %s: %v", name, got)
		}
	}
	if len(rev0) < 40 || !rev0["tiers[].tolerableWaitSeconds"] {
		t.Fatalf("testdata/schema-revision-0.txt holds %d fields; is it the right file?", len(rev0))
	}
}

// underRegistered says whether a parent of path p is registered.
func underRegistered(p string, registered map[string]bool) bool {
	for {
		i := strings.LastIndex(p, ".")
		if i < 0 {
			return false
		}
		p = strings.TrimSuffix(p[:i], "[]")
		if registered[p] {
			return true
		}
	}
}

// TestDecodeSchemaVersion: revisions up to this build's decode; a newer
// one is refused with a *SchemaError before its unknown fields are; a
// negative one is invalid; typos stay refused at every revision.
func TestDecodeSchemaVersion(t *testing.T) {
	const body = `"version":1,"pool":"ns/p","slots":0,"serviceRate":1,"ageingRate":1,"authentication":{"mode":"TrustedHeader","headerName":"X-Tenant"},"tiers":[{"name":"a","basePriority":1,"tolerableWaitSeconds":1,"queueBound":1,"tenantConcurrencyLimit":1,"tenantQueueLimit":1}],"backends":[]`
	newer := strconv.Itoa(SchemaVersion + 1)
	refusal := "policy: decode: schemaVersion " + newer + " is newer than " + strconv.Itoa(SchemaVersion) + ", the newest this build understands"
	tests := map[string]struct {
		doc        string
		want       int
		wantErr    string
		wantSchema bool
	}{
		"revision 0 (no field)": {doc: `{` + body + `}`, want: 0},
		"revision 1":            {doc: `{"schemaVersion":1,` + body + `}`, want: 1},
		"yaml, revision 1":      {doc: "schemaVersion: 1\n" + yamlOf(t, `{`+body+`}`), want: 1},
		"the next revision, with a field this build lacks": {doc: `{"schemaVersion":` + newer + `,"fairness":{"mode":"Tokens"},` + body + `}`,
			wantSchema: true, wantErr: refusal},
		"yaml, the next revision": {doc: "schemaVersion: " + newer + "\nfairness: {}\n" + yamlOf(t, `{`+body+`}`),
			wantSchema: true, wantErr: refusal},
		"a typo at revision 1": {doc: `{"schemaVersion":1,"slot":1,` + body + `}`,
			wantErr: `policy: decode: json: unknown field "slot"`},
		"not a number": {doc: `{"schemaVersion":"2",` + body + `}`,
			wantErr: "policy: decode: json: cannot unmarshal string into Go struct field Policy.schemaVersion of type int"},
		"negative": {doc: `{"schemaVersion":-1,` + body + `}`,
			wantErr: "policy: invalid: schemaVersion: must be >= 0, got -1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := DecodeAndValidate([]byte(tc.doc))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.SchemaVersion != tc.want {
					t.Errorf("schemaVersion %d, want %d", p.SchemaVersion, tc.want)
				}
				return
			}
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			var se *SchemaError
			if got := errors.Is(err, ErrUnsupportedSchema) && errors.As(err, &se) && errors.Is(err, ErrDecode); got != tc.wantSchema {
				t.Errorf("errors.Is(ErrUnsupportedSchema, ErrDecode) and a *SchemaError: %v, want %v", got, tc.wantSchema)
			}
			if tc.wantSchema && se.Got != SchemaVersion+1 {
				t.Errorf("SchemaError.Got = %d, want %d", se.Got, SchemaVersion+1)
			}
		})
	}
}

// yamlOf turns a flat JSON object into YAML lines (JSON is YAML; one
// key per line so a YAML key can be put before it).
func yamlOf(t *testing.T, js string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + ": " + string(m[k]) + "\n")
	}
	return b.String()
}

// fairnessPolicy is budgetPolicy with every field of revision 3 in use.
func fairnessPolicy() Policy {
	p := *budgetPolicy()
	p.Version, p.Pool = 3, "ns/p"
	p.Fairness = &Fairness{Mode: FairnessTokens, InputWeight: 1, OutputWeight: 4}
	p.TokenServiceRate = 1756.1
	p.Tiers = slices.Clone(p.Tiers)
	p.Tiers[0].QueueTokenBound, p.Tiers[0].TenantQueueTokenLimit = 8780, 2195
	p.Tenants = slices.Clone(p.Tenants)
	p.Tenants[0].Weight = 3
	return p
}

// clearFairness removes every field of revision 3 from p, in place.
func clearFairness(p *Policy) {
	p.Fairness, p.TokenServiceRate = nil, 0
	for i := range p.Tiers {
		p.Tiers[i].QueueTokenBound, p.Tiers[i].TenantQueueTokenLimit = 0, 0
	}
	for i := range p.Tenants {
		p.Tenants[i].Weight = 0
	}
}

// TestAtRevisionTwoAndThree: revision 3 keeps fairness and the token
// bounds; revision 2 clears them, naming those in use in registry order,
// and keeps the budgets of revision 2; revision 1 clears both sets.
func TestAtRevisionTwoAndThree(t *testing.T) {
	rev3 := []string{"fairness", "tokenServiceRate", "tiers[].queueTokenBound", "tiers[].tenantQueueTokenLimit", "tenants[].weight"}
	tests := map[string]struct {
		in          func(*Policy)
		rev         int
		want        func(*Policy)
		wantDropped []string
	}{
		"revision 3 keeps everything": {rev: 3},
		"revision 2 clears the five":  {rev: 2, want: clearFairness, wantDropped: rev3},
		"revision 1 clears revision 2's too": {rev: 1, want: func(p *Policy) { clearFairness(p); clearBudgets(p) },
			wantDropped: append([]string{"tokens", "tiers[].tenantLimits", "tenants[].limits"}, rev3...)},
		"only a tenant's weight": {rev: 2, in: func(p *Policy) {
			w := p.Tenants[0].Weight
			clearFairness(p)
			p.Tenants[0].Weight = w
		}, want: clearFairness, wantDropped: rev3[4:]},
		// A tenant limit in tokens never goes without its bound, but the
		// registry names each field on its own.
		"only the tiers' bounds": {rev: 2, in: func(p *Policy) {
			b, l := p.Tiers[0].QueueTokenBound, p.Tiers[0].TenantQueueTokenLimit
			clearFairness(p)
			p.Tiers[0].QueueTokenBound, p.Tiers[0].TenantQueueTokenLimit = b, l
		}, want: clearFairness, wantDropped: rev3[2:4]},
		"fairness in Requests mode is still the field": {rev: 2, in: func(p *Policy) {
			clearFairness(p)
			p.Fairness = &Fairness{Mode: FairnessRequests}
		}, want: clearFairness, wantDropped: rev3[:1]},
		"nothing of revision 3 in use: nothing named": {rev: 2, in: clearFairness, want: clearFairness},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := fairnessPolicy()
			if tc.in != nil {
				tc.in(&p)
			}
			want := clonePolicy(t, p)
			if tc.want != nil {
				tc.want(&want)
			}
			want.SchemaVersion = tc.rev
			before := clonePolicy(t, p)
			got, dropped := p.At(tc.rev)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("At(%d) (-want +got):\n%s", tc.rev, diff)
			}
			if diff := cmp.Diff(tc.wantDropped, dropped); diff != "" {
				t.Errorf("At(%d) dropped (-want +got):\n%s", tc.rev, diff)
			}
			if diff := cmp.Diff(before, p); diff != "" {
				t.Errorf("At(%d) wrote through to the caller's policy (-before +after):\n%s", tc.rev, diff)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("At(%d) is invalid: %v", tc.rev, err)
			}
		})
	}
	q, _ := fairnessPolicy().At(2)
	b, err := json.Marshal(q)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"fairness", "tokenServiceRate", "queueTokenBound", "tenantQueueTokenLimit", `"weight"`} {
		if strings.Contains(string(b), field) {
			t.Errorf("At(2) encodes %s, which a revision-2 dispatcher refuses: %s", field, b)
		}
	}
}

// FairnessOf fills the defaults field by field; Cost weighs prompt and
// output.
func TestFairnessOfAndCost(t *testing.T) {
	tests := map[string]struct {
		in   *Fairness
		want Fairness
		cost int64 // of 100 prompt and 10 output tokens
	}{
		"absent":         {want: Fairness{Mode: FairnessRequests, InputWeight: 1, OutputWeight: 2}, cost: 120},
		"empty":          {in: &Fairness{}, want: Fairness{Mode: FairnessRequests, InputWeight: 1, OutputWeight: 2}, cost: 120},
		"mode only":      {in: &Fairness{Mode: FairnessTokens}, want: Fairness{Mode: FairnessTokens, InputWeight: 1, OutputWeight: 2}, cost: 120},
		"one weight set": {in: &Fairness{OutputWeight: 5}, want: Fairness{Mode: FairnessRequests, InputWeight: 1, OutputWeight: 5}, cost: 150},
		"both set":       {in: &Fairness{Mode: FairnessTokens, InputWeight: 1000, OutputWeight: 1000}, want: Fairness{Mode: FairnessTokens, InputWeight: 1000, OutputWeight: 1000}, cost: 110000},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := Policy{Fairness: tc.in}
			got := p.FairnessOf()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FairnessOf (-want +got):\n%s", diff)
			}
			if c := got.Cost(100, 10); c != tc.cost {
				t.Errorf("Cost(100, 10) = %d, want %d", c, tc.cost)
			}
		})
	}
	for _, tc := range []struct {
		tn   *Tenant
		want int
	}{{nil, 1}, {&Tenant{}, 1}, {&Tenant{Weight: -3}, 1}, {&Tenant{Weight: 7}, 7}} {
		if got := tc.tn.WeightOf(); got != tc.want {
			t.Errorf("WeightOf(%+v) = %d, want %d", tc.tn, got, tc.want)
		}
	}
}
