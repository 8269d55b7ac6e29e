package queue

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoWallClockOrSleep: the queue takes all time from its injected clock
// and never sleeps or polls (docs/architecture.md#the-queue).
func TestNoWallClockOrSleep(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	banned := map[string]bool{"Now": true, "Sleep": true, "Since": true, "Until": true, "Tick": true, "NewTicker": true, "After": true, "AfterFunc": true, "NewTimer": true}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && banned[sel.Sel.Name] {
				t.Errorf("%s: time.%s; use the injected clock", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
		src, _ := os.ReadFile(f)
		for _, imp := range []string{`"net/http"`, `"k8s.io/api`, `"k8s.io/apimachinery`, `"k8s.io/client-go`, `"sigs.k8s.io/controller-runtime`} {
			if strings.Contains(string(src), imp) {
				t.Errorf("%s imports %s", f, imp)
			}
		}
	}
}

// TestSteadyStateAllocs: one admit + dispatch + release cycle on a queue of
// 1000 jobs allocates at most one object (the caller's Handle).
func TestSteadyStateAllocs(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("instrumented build")
	}
	clk := &benchClock{now: t0}
	q := New(clk)
	q.UpdatePolicy(benchPolicy(benchSlots, 1000))
	w := newBenchWorkload(q, benchTenants, 1000)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(2000, func() { w.cycle(ctx, clk) })
	t.Logf("%.2f allocs per cycle", allocs)
	if allocs > 1 {
		t.Fatalf("%.2f allocs per steady-state dispatch, want <= 1", allocs)
	}
}
