package main

import (
	"fmt"
	"go/scanner"
	"go/token"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
)

// Missing is one reference to a path that does not exist.
type Missing struct {
	File string
	Line int
	Path string
}

func (m Missing) String() string {
	return fmt.Sprintf("%s:%d: reference to missing path %s", m.File, m.Line, m.Path)
}

var (
	// mdLink is an inline link or image target: ](target) or
	// ](target "title").
	mdLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// mdRefDef is a reference definition: [label]: target.
	mdRefDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)`)
	// url is anything with a scheme; its path is someone else's.
	url = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://\S*|mailto:\S*`)
	// word is a candidate path, wildcards and placeholders included so
	// that patterns can be told apart and skipped.
	word = regexp.MustCompile(`[A-Za-z0-9_./*{}<>$~-]+`)
)

// ref is one reference found on a line: where it is and how to resolve it.
type ref struct {
	line int
	path string
	// link: a Markdown link target, resolved against the file's
	// directory only (or the root with a leading slash).
	link bool
}

// Check finds the references in files (paths relative to the root of
// fsys) and returns those that do not resolve, in file and line order, and
// how many references it checked.
func Check(fsys fs.FS, files []string) ([]Missing, int, error) {
	top := topLevel(files)
	var missing []Missing
	n := 0
	for _, f := range files {
		src, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, 0, err
		}
		var refs []ref
		switch {
		case strings.HasSuffix(f, ".md"):
			refs = markdownRefs(string(src), top)
		case strings.HasSuffix(f, ".go"):
			refs = goCommentRefs(f, src, top)
		default:
			refs = hashCommentRefs(string(src), top)
		}
		for _, r := range refs {
			n++
			if !resolves(fsys, path.Dir(f), r) {
				missing = append(missing, Missing{File: f, Line: r.line, Path: r.path})
			}
		}
	}
	sort.SliceStable(missing, func(i, j int) bool {
		if missing[i].File != missing[j].File {
			return missing[i].File < missing[j].File
		}
		return missing[i].Line < missing[j].Line
	})
	return missing, n, nil
}

// topLevel is the set of first path elements of files: the names a
// root-relative path may start with.
func topLevel(files []string) map[string]bool {
	top := map[string]bool{}
	for _, f := range files {
		if i := strings.IndexByte(f, '/'); i > 0 {
			top[f[:i]] = true
		}
	}
	return top
}

// markdownRefs are the link targets and path-like words of a Markdown file.
func markdownRefs(src string, top map[string]bool) []ref {
	var refs []ref
	for i, line := range strings.Split(src, "\n") {
		targets := mdLink.FindAllStringSubmatch(line, -1)
		if m := mdRefDef.FindStringSubmatch(line); m != nil {
			targets = append(targets, m)
		}
		for _, m := range targets {
			if t, ok := linkTarget(m[1]); ok {
				refs = append(refs, ref{line: i + 1, path: t, link: true})
			}
		}
		// The targets are judged as links only.
		rest := mdRefDef.ReplaceAllString(mdLink.ReplaceAllString(line, "]"), "")
		refs = append(refs, wordRefs(i+1, rest, top)...)
	}
	return refs
}

// linkTarget is the path a link target names, without its fragment, or
// false when it names no file of the repository (a URL, an anchor).
func linkTarget(t string) (string, bool) {
	if url.MatchString(t) || strings.HasPrefix(t, "#") || strings.Contains(t, ":") {
		return "", false
	}
	if i := strings.IndexAny(t, "#?"); i >= 0 {
		t = t[:i]
	}
	return t, t != ""
}

// goCommentRefs are the path-like words in the comments of a Go file.
func goCommentRefs(name string, src []byte, top map[string]bool) []ref {
	fset := token.NewFileSet()
	file := fset.AddFile(name, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, func(token.Position, string) {}, scanner.ScanComments)
	var refs []ref
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return refs
		}
		if tok != token.COMMENT {
			continue
		}
		first := fset.Position(pos).Line
		for i, line := range strings.Split(lit, "\n") {
			refs = append(refs, wordRefs(first+i, line, top)...)
		}
	}
}

// hashCommentRefs are the path-like words of the whole-line # comments of
// a shell script, YAML file, Makefile or Dockerfile (a # after code may be
// part of it, as in "$#").
func hashCommentRefs(src string, top map[string]bool) []ref {
	var refs []ref
	for i, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") && !strings.HasPrefix(t, "#!") {
			refs = append(refs, wordRefs(i+1, t, top)...)
		}
	}
	return refs
}

// wordRefs are the path-like words of one line of prose: a word ending in
// ".md", or one whose first element is a top-level entry followed by a
// slash. Words with wildcards or placeholders are patterns and skipped.
func wordRefs(line int, text string, top map[string]bool) []ref {
	var refs []ref
	for _, w := range word.FindAllString(url.ReplaceAllString(text, " "), -1) {
		w = strings.TrimRight(w, ".")
		for strings.HasPrefix(w, "./") {
			w = w[2:]
		}
		if w == "" || strings.ContainsAny(w, "*{}<>$~") || strings.HasPrefix(w, "/") || strings.Contains(w, "//") {
			continue
		}
		first, _, nested := strings.Cut(w, "/")
		// A bare ".md" is the suffix talked about, not a file.
		if (strings.HasSuffix(w, ".md") && path.Base(w) != ".md") || (nested && top[first]) {
			refs = append(refs, ref{line: line, path: w})
		}
	}
	return refs
}

// resolves reports whether r names an existing file or directory: a link
// relative to dir (or to the root with a leading slash), a word relative
// to the root or to dir.
func resolves(fsys fs.FS, dir string, r ref) bool {
	if r.link {
		if strings.HasPrefix(r.path, "/") {
			return exists(fsys, r.path[1:])
		}
		return exists(fsys, path.Join(dir, r.path))
	}
	return exists(fsys, r.path) || exists(fsys, path.Join(dir, r.path))
}

func exists(fsys fs.FS, p string) bool {
	p = path.Clean(p)
	if !fs.ValidPath(p) {
		return false
	}
	_, err := fs.Stat(fsys, p)
	return err == nil
}
