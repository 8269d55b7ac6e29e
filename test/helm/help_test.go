package helm

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/tiergate/tiergate/internal/testutil"
)

// The chart and the binaries' --help are checked against each other, from
// the data alone, so that a flag or value added on either side is covered:
//
//   - every flag the chart renders exists (TestChartFlagsExist);
//   - a flag the default render passes, where --help states a default,
//     passes that default: a built-in default changed in the binary
//     without the chart (or the other way round) fails;
//   - every --flag the README's values table names exists in the --help
//     of the role the value belongs to (controller.* the controller,
//     dispatcher.* and redis.* the dispatcher);
//   - the README's default of every value is the one values.yaml holds
//     (TestReadmeDefaultsAreTheValues).

var helpDefault = regexp.MustCompile(`\(default (.+)\)$`)

// helpDefaults maps each flag of `tiergate <sub> --help` to the default
// its usage states ("" when it states none, as the flag package does for
// zero values).
func helpDefaults(t *testing.T, sub string) map[string]string {
	t.Helper()
	r := command(testutil.Tool{Bin: binary(t)}).Run(sub, "--help")
	if r.Err != nil {
		t.Fatalf("tiergate %s --help:\n%s", sub, r)
	}
	out := map[string]string{}
	name := ""
	for _, line := range strings.Split(r.Stderr+r.Stdout, "\n") {
		if m := helpFlag.FindStringSubmatch(line); m != nil {
			name = m[1]
			out[name] = ""
		}
		if m := helpDefault.FindStringSubmatch(strings.TrimSpace(line)); m != nil && name != "" {
			out[name] = m[1]
		}
	}
	if len(out) == 0 {
		t.Fatalf("tiergate %s --help lists no flags:\n%s", sub, r)
	}
	return out
}

// sameValue compares a flag value with a --help default: strings
// unquoted, durations by what they mean ("300s" is "5m0s").
func sameValue(value, def string) bool {
	if u, err := strconv.Unquote(def); err == nil {
		def = u
	}
	if value == def {
		return true
	}
	a, errA := time.ParseDuration(value)
	b, errB := time.ParseDuration(def)
	return errA == nil && errB == nil && a == b
}

func deployment(t *testing.T, objs []*unstructured.Unstructured, suffix string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), suffix) {
			return o
		}
	}
	t.Fatalf("no Deployment *%s rendered", suffix)
	return nil
}

func TestChartDefaultsAreTheBinariesDefaults(t *testing.T) {
	objs := render(t)
	for _, role := range []string{"controller", "dispatcher"} {
		t.Run(role, func(t *testing.T) {
			defs := helpDefaults(t, role)
			checked := 0
			for _, arg := range args(t, deployment(t, objs, "-"+role))[1:] {
				name, value, ok := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
				def, known := defs[name]
				if !ok || !known || def == "" {
					continue // a bare bool, an unknown flag (TestChartFlagsExist), or no default to keep
				}
				checked++
				if !sameValue(value, def) {
					t.Errorf("the chart's defaults pass --%s=%s, but tiergate %s's default is %s: change one of them, or both", name, value, role, def)
				}
			}
			if checked == 0 {
				t.Errorf("no flag the chart passes has a default in tiergate %s --help: the check checks nothing", role)
			}
		})
	}
}

var tableFlag = regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)")

// roleOf is the binary whose flags a value of the chart sets.
func roleOf(value string) string {
	switch strings.SplitN(value, ".", 2)[0] {
	case "controller":
		return "controller"
	case "dispatcher", "redis":
		return "dispatcher"
	}
	return ""
}

func TestReadmeValuesNameRealFlags(t *testing.T) {
	flags := map[string]map[string]bool{"controller": flagsOf(t, "controller"), "dispatcher": flagsOf(t, "dispatcher")}
	rows := readmeTable(t)
	named := 0
	for _, row := range rows {
		for _, m := range tableFlag.FindAllStringSubmatch(row.meaning, -1) {
			named++
			role := roleOf(row.value)
			switch {
			case role != "" && !flags[role][m[1]]:
				t.Errorf("README row %s names --%s, which tiergate %s does not have", row.value, m[1], role)
			case role == "" && !flags["controller"][m[1]] && !flags["dispatcher"][m[1]]:
				t.Errorf("README row %s names --%s, which neither binary has", row.value, m[1])
			}
		}
	}
	if named == 0 {
		t.Fatal("the README's values table names no flag")
	}
}

// readmeRowFull is a row of the values table: value, default, meaning.
var readmeRowFull = regexp.MustCompile("(?m)^\\| `([a-zA-Z0-9_.]+)` \\| (.*?) \\| (.*) \\|$")

type tableRow struct{ value, def, meaning string }

func readmeTable(t *testing.T) []tableRow {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := bytes.Cut(readme, []byte("## Values\n"))
	if !ok {
		t.Fatal("README.md has no ## Values section")
	}
	var rows []tableRow
	for _, m := range readmeRowFull.FindAllSubmatch(table, -1) {
		rows = append(rows, tableRow{string(m[1]), string(m[2]), string(m[3])})
	}
	if len(rows) == 0 {
		t.Fatal("the README's values table has no rows")
	}
	return rows
}

// lookup is the value at a dotted path of values.yaml.
func lookup(values map[string]any, path string) (any, bool) {
	var cur any = values
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// A default in backticks is YAML and must be what values.yaml holds; one
// in words describes a map or list that is not empty. "global" is Helm's.
func TestReadmeDefaultsAreTheValues(t *testing.T) {
	values, _ := loadValuesAndSchema(t)
	for _, row := range readmeTable(t) {
		if row.value == "global" {
			continue
		}
		got, ok := lookup(values, row.value)
		if !ok {
			t.Errorf("README row %s: no such value in values.yaml", row.value)
			continue
		}
		lit, isLit := strings.CutPrefix(row.def, "`")
		lit, closed := strings.CutSuffix(lit, "`")
		if !isLit || !closed || strings.Contains(lit, "`") {
			if m, ok := got.(map[string]any); ok && len(m) > 0 {
				continue // a described map: resources, security contexts
			}
			t.Errorf("README row %s: default %q is not a `literal`, and values.yaml has %v", row.value, row.def, got)
			continue
		}
		var want any
		if err := yaml.Unmarshal([]byte(lit), &want); err != nil {
			t.Errorf("README row %s: default %s is not YAML: %v", row.value, row.def, err)
			continue
		}
		if !reflect.DeepEqual(normalise(want), normalise(got)) {
			t.Errorf("README row %s: default %s, values.yaml has %v", row.value, row.def, got)
		}
	}
}

// normalise makes an empty map, list or nil comparable as they unmarshal.
func normalise(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			return map[string]any{}
		}
	case []any:
		if len(x) == 0 {
			return []any{}
		}
	}
	return v
}
