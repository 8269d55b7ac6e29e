// Command checkrefs fails when a tracked Markdown file or Go comment refers
// to a file or directory of the repository that does not exist, so a doc
// or comment pointing at a moved, renamed or never-committed file is
// caught by `make verify` (hack/verify.sh runs it).
//
// It reads the files `git ls-files` lists: *.md, the
// comments of *.go (found with go/scanner, so paths in code are not
// judged), and the whole-line # comments of *.sh, *.yaml, *.yml, Makefile
// and Dockerfile. It checks:
//
//   - Markdown links [text](target) and reference definitions [x]: target
//     in .md files, resolved against the file's directory (a target with a
//     leading slash against the repository root); URLs and #anchors are
//     not checked, and a #fragment is dropped;
//   - path-like words in all of them: a word ending in ".md" (README.md,
//     docs/fleet.md), or one whose first element is a top-level entry of
//     the repository followed by a slash (hack/tools.sh, dispatcher/queue),
//     resolved against the root and then the file's directory. Words with
//     wildcards or placeholders (*, {}, <>, $) are patterns, not paths.
//
// Every miss is reported as "FILE:LINE: reference to missing path X" on
// stderr, and the exit status is 1.
//
// Concurrency: none; a sequential command-line program.
package main
