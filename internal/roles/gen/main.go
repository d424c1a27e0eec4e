// Command gen writes deploy/postgres/bootstrap.sql and the four
// deploy/postgres/<kind>-role.sql files from package roles: go generate
// ./internal/roles.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sidefx/sidefx/internal/roles"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gen DIR (deploy/postgres)")
		os.Exit(2)
	}
	files, err := roles.Files()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(os.Args[1], name), []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
