// Command fixture decodes a TIFF image from stdin: it calls
// golang.org/x/image/tiff.Decode, the symbol of advisory GO-2026-4815.
package main

import (
	"fmt"
	"os"

	"golang.org/x/image/tiff"
)

func main() {
	img, err := tiff.Decode(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(img.Bounds())
}
