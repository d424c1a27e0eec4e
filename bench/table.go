package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The table's value columns.
const (
	colSidefx  = "sidefx"
	colRiver   = "River"
	colRiverU  = "River unique"
	colFloor   = "floor / baseline"
	numColumns = 4
)

var columns = [numColumns]string{colSidefx, colRiver, colRiverU, colFloor}

// row is one workload × variant; cells holds every run's value per column.
type row struct {
	workload, variant, unit string
	// perTx is the effects per business transaction times the producers,
	// for the enqueue rows' overhead column; 0 elsewhere.
	perTx float64
	cells map[string][]float64
}

type table struct {
	rows []*row
	// notes explain workloads whose columns mean something else than
	// the contenders' (edge, inbox), printed under the table.
	notes []string
}

// note adds a paragraph under the table, once.
func (t *table) note(s string) {
	if !slices.Contains(t.notes, s) {
		t.notes = append(t.notes, s)
	}
}

func newTable() *table { return &table{} }

func (t *table) row(workload, variant, unit string) *row {
	if r := t.find(workload, variant, unit); r != nil {
		return r
	}
	r := &row{workload: workload, variant: variant, unit: unit, cells: map[string][]float64{}}
	t.rows = append(t.rows, r)
	return r
}

// find returns the row, or nil.
func (t *table) find(workload, variant, unit string) *row {
	for _, r := range t.rows {
		if r.workload == workload && r.variant == variant && r.unit == unit {
			return r
		}
	}
	return nil
}

func (t *table) add(workload, variant, unit, column string, v float64) {
	r := t.row(workload, variant, unit)
	r.cells[column] = append(r.cells[column], v)
	logf("  %s | %s | %s: %.4g %s", workload, variant, column, v, unit)
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *row) median(col string) float64 { return median(r.cells[col]) }

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// markdown renders the medians and the ratios sidefx/River,
// sidefx/River unique and sidefx/floor.
func (t *table) markdown() string {
	var b strings.Builder
	// A --against revision's column, if any: its medians and the working
	// tree's over them, at the end of each row.
	revCol := ""
	for _, r := range t.rows {
		for c := range r.cells {
			if strings.HasPrefix(c, "sidefx @") {
				revCol = c
			}
		}
	}
	head, rule := "", ""
	if revCol != "" {
		head, rule = fmt.Sprintf(" %s | sidefx/%s |", revCol, revCol[len("sidefx "):]), "--:|--:|"
	}
	b.WriteString("| Workload | Variant | Unit | sidefx | River | River unique | floor / baseline | sidefx/River | sidefx/River unique | sidefx/floor | sidefx µs extra per tx |" + head + "\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|" + rule + "\n")
	for _, r := range t.rows {
		tail := ""
		if revCol != "" {
			tail = fmt.Sprintf(" %s | %s |", num(r.median(revCol)), ratio(r.median(colSidefx), r.median(revCol)))
		}
		s, rv, ru, f := r.median(colSidefx), r.median(colRiver), r.median(colRiverU), r.median(colFloor)
		extra := "–"
		if r.perTx > 0 && !math.IsNaN(s) && !math.IsNaN(f) {
			extra = fmt.Sprintf("%.0f", (r.perTx/s-r.perTx/f)*1e6)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |%s\n",
			r.workload, r.variant, r.unit, num(s), num(rv), num(ru), num(f),
			ratio(s, rv), ratio(s, ru), ratio(s, f), extra, tail)
	}
	for _, n := range t.notes {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}
