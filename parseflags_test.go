package main

import (
	"bytes"
	"flag"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseFlags(t *testing.T) {
	tests := map[string]struct {
		args       []string
		hint       string
		wantCode   int
		wantDone   bool
		wantStderr string
	}{
		"flags only":           {args: []string{"-n", "3"}},
		"no arguments":         {},
		"help":                 {args: []string{"--help"}, wantDone: true},
		"unknown flag":         {args: []string{"--nope"}, wantCode: 2, wantDone: true, wantStderr: "flag provided but not defined: -nope\n"},
		"bad value":            {args: []string{"-n", "x"}, wantCode: 2, wantDone: true, wantStderr: "invalid value \"x\" for flag -n: parse error\n"},
		"positional":           {args: []string{"a", "b"}, wantCode: 2, wantDone: true, wantStderr: "tiergate test: unexpected arguments [\"a\" \"b\"]\n"},
		"positional with hint": {args: []string{"-n", "1", "a"}, hint: " (files go after -f)", wantCode: 2, wantDone: true, wantStderr: "tiergate test: unexpected arguments [\"a\"] (files go after -f)\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs := flag.NewFlagSet("tiergate test", flag.ContinueOnError)
			fs.SetOutput(&stderr)
			fs.Usage = func() {} // the subcommands print their own usage
			fs.Int("n", 0, "a number")
			code, done := parseFlags(fs, tc.args, &stderr, tc.hint)
			if diff := cmp.Diff([]any{tc.wantCode, tc.wantDone, tc.wantStderr}, []any{code, done, stderr.String()}); diff != "" {
				t.Errorf("code, done, stderr (-want +got):\n%s", diff)
			}
		})
	}
}
