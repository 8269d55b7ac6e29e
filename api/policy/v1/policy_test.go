package v1

import (
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// render is what a golden file holds: the decode error, every validation
// error with its field path, or the decoded policy re-encoded as JSON.
func render(data []byte) string {
	p, err := Decode(data)
	if err != nil {
		if !errors.Is(err, ErrDecode) {
			return "unexpected error type: " + err.Error() + "\n"
		}
		return "decode error: " + err.Error() + "\n"
	}
	if err := p.Validate(); err != nil {
		var ve ValidationErrors
		if !errors.As(err, &ve) {
			return "unexpected error type: " + err.Error() + "\n"
		}
		var b strings.Builder
		b.WriteString("invalid:\n")
		for _, fe := range ve {
			b.WriteString(fe.Field + ": " + fe.Message + "\n")
		}
		return b.String()
	}
	out, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return "marshal: " + err.Error() + "\n"
	}
	return "valid:\n" + string(out) + "\n"
}

func TestGolden(t *testing.T) {
	var inputs []string
	for _, pat := range []string{"testdata/*.json", "testdata/*.yaml"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, m...)
	}
	if len(inputs) < 30 {
		t.Fatalf("only %d golden inputs found", len(inputs))
	}
	for _, in := range inputs {
		name := filepath.Base(in)
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got := render(data)
			golden := strings.TrimSuffix(in, filepath.Ext(in)) + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update once to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("%s (-want +got):\n%s", golden, diff)
			}
			// The file name says what it must be.
			switch {
			case strings.HasPrefix(name, "valid-") && !strings.HasPrefix(got, "valid:"),
				strings.HasPrefix(name, "invalid-") && !strings.HasPrefix(got, "invalid:"),
				strings.HasPrefix(name, "decode-") && !strings.HasPrefix(got, "decode error:"):
				t.Errorf("%s renders as %q", name, strings.SplitN(got, "\n", 2)[0])
			}
		})
	}
}

// TestInvalidFilesHaveOneCause: every invalid-* fixture except
// invalid-many breaks exactly the rule it is named for, so each violation
// is covered on its own.
func TestInvalidFilesHaveOneCause(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid-*.json")
	for _, f := range files {
		if strings.Contains(f, "invalid-many") {
			continue
		}
		data, _ := os.ReadFile(f)
		p, err := Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var ve ValidationErrors
		if !errors.As(p.Validate(), &ve) {
			t.Fatalf("%s: valid", f)
		}
		fields := map[string]bool{}
		for _, fe := range ve {
			top, _, _ := strings.Cut(fe.Field, ".")
			top, _, _ = strings.Cut(top, "[")
			fields[top] = true
		}
		if len(fields) != 1 {
			t.Errorf("%s: violations in %d places: %v", f, len(fields), ve)
		}
	}
}

func TestJSONAndYAMLAgree(t *testing.T) {
	j, err := os.ReadFile("testdata/valid-seed.json")
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile("testdata/valid-seed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pj, err := DecodeAndValidate(j)
	if err != nil {
		t.Fatal(err)
	}
	py, err := DecodeAndValidate(y)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pj, py); diff != "" {
		t.Errorf("JSON vs YAML (-json +yaml):\n%s", diff)
	}
}

func TestValidationErrorsShape(t *testing.T) {
	p := &Policy{AgeingRate: 1, Authentication: Authentication{Mode: AuthAPIKey}, Slots: -1}
	err := p.Validate()
	var ve ValidationErrors
	if !errors.As(err, &ve) {
		t.Fatalf("Validate = %T, want ValidationErrors", err)
	}
	want := ValidationErrors{
		{Field: "slots", Message: "must be >= 0, got -1"},
		{Field: "tiers", Message: "at least one tier is required"},
	}
	if diff := cmp.Diff(want, ve); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := err.Error(); got != "policy: invalid: slots: must be >= 0, got -1; tiers: at least one tier is required" {
		t.Errorf("Error() = %q", got)
	}
	var nilPolicy *Policy
	if err := nilPolicy.Validate(); err == nil {
		t.Error("nil policy validated")
	}
}

func TestCheckVersion(t *testing.T) {
	tests := map[string]struct {
		current, next int64
		wantErr       string
	}{
		"newer":  {current: 3, next: 4},
		"same":   {current: 3, next: 3},
		"older":  {current: 3, next: 2, wantErr: "policy: stale version: have 3, got 2"},
		"first":  {current: 0, next: 1},
		"zero":   {current: 0, next: 0},
		"behind": {current: 100, next: 0, wantErr: "policy: stale version: have 100, got 0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := CheckVersion(tc.current, tc.next)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrStaleVersion) || err.Error() != tc.wantErr {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// Messages JSON cannot reach (NaN and infinities, a nil policy), so the
// golden files cannot hold them.
func TestValidateMessagesWithoutGoldenFiles(t *testing.T) {
	valid := func() *Policy {
		return &Policy{
			Slots: 1, ServiceRate: 1, AgeingRate: 6,
			Authentication: Authentication{Mode: AuthAPIKey},
			Tiers:          []Tier{{Name: "premium", TolerableWaitSeconds: 5, QueueBound: 1, TenantConcurrencyLimit: 1, TenantQueueLimit: 1}},
			Backends:       []Backend{{Address: "10.0.0.7:8000"}},
		}
	}
	tests := map[string]struct {
		policy func() *Policy
		want   ValidationErrors
	}{
		"nil policy": {
			policy: func() *Policy { return nil },
			want:   ValidationErrors{{Field: "", Message: "policy is missing"}},
		},
		"NaN service rate": {
			policy: func() *Policy { p := valid(); p.ServiceRate = math.NaN(); return p },
			want:   ValidationErrors{{Field: "serviceRate", Message: "must be a finite number >= 0, got NaN"}},
		},
		"infinite ageing rate": {
			policy: func() *Policy { p := valid(); p.AgeingRate = math.Inf(1); return p },
			want:   ValidationErrors{{Field: "ageingRate", Message: "must be a finite number > 0, got +Inf"}},
		},
		"infinite client timeout": {
			policy: func() *Policy { p := valid(); p.ClientTimeoutSeconds = math.Inf(1); return p },
			want:   ValidationErrors{{Field: "clientTimeoutSeconds", Message: "must be a finite number >= 0 (0 disables expiry), got +Inf"}},
		},
		"NaN tolerable wait": {
			policy: func() *Policy { p := valid(); p.Tiers[0].TolerableWaitSeconds = math.NaN(); return p },
			want:   ValidationErrors{{Field: "tiers[0].tolerableWaitSeconds", Message: "must be a finite number > 0, got NaN"}},
		},
		"NaN token service rate": {
			policy: func() *Policy { p := valid(); p.TokenServiceRate = math.NaN(); return p },
			want:   ValidationErrors{{Field: "tokenServiceRate", Message: "must be a finite number >= 0, got NaN"}},
		},
		"infinite token service rate": {
			policy: func() *Policy { p := valid(); p.TokenServiceRate = math.Inf(1); return p },
			want:   ValidationErrors{{Field: "tokenServiceRate", Message: "must be a finite number >= 0, got +Inf"}},
		},
		"valid": {policy: valid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.policy().Validate()
			var got ValidationErrors
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("Validate = %T %v, want ValidationErrors", err, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
