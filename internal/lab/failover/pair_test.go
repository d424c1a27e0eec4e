package failover

import (
	"context"
	"errors"

	"github.com/sidefx/sidefx/internal/lab/pgcluster"
)

// ha is a primary and a standby that a failover swaps.
type ha interface {
	// url is the multi-host connection string of database postgres, valid
	// across every failover.
	url() string
	// kill kills the primary's server (SIGKILL), as a crashed machine.
	kill() error
	// promote makes the standby the primary, and returns once it takes
	// writes: pg_ctl promote, or the HA manager's own promotion.
	promote(ctx context.Context) error
	// rebuild gives the new primary a standby again, on the killed
	// server's port.
	rebuild(ctx context.Context) error
	close() error
}

// pair is a pgcluster primary with a streaming standby; promotion is
// scripted (pg_ctl promote), as an operator or a script would run it.
type pair struct {
	sync             bool
	primary, standby *pgcluster.Cluster
	dead             []*pgcluster.Cluster
	hosts            string
}

func startPair(ctx context.Context, sync bool) (_ *pair, err error) {
	p := &pair{sync: sync}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	if p.primary, err = pgcluster.Start(ctx, &pgcluster.Options{Name: "failover-primary"}); err != nil {
		return nil, err
	}
	if p.standby, err = p.primary.StartStandby(ctx, &pgcluster.StandbyOptions{Synchronous: sync, Name: "failover-standby"}); err != nil {
		return nil, err
	}
	p.hosts = pgcluster.MultiHostConnString("postgres", p.primary, p.standby)
	return p, nil
}

func (p *pair) url() string { return p.hosts }

func (p *pair) kill() error {
	err := p.primary.Kill()
	p.dead = append(p.dead, p.primary)
	return err
}

func (p *pair) promote(ctx context.Context) error {
	if err := p.standby.Promote(ctx); err != nil {
		return err
	}
	p.primary, p.standby = p.standby, nil
	return nil
}

func (p *pair) rebuild(ctx context.Context) error {
	dead := p.dead[len(p.dead)-1]
	// The killed server's directory goes first: its port is the new
	// standby's.
	if err := dead.Destroy(); err != nil {
		return err
	}
	s, err := p.primary.StartStandby(ctx, &pgcluster.StandbyOptions{Synchronous: p.sync, Name: "failover-standby", Port: dead.Port()})
	if err != nil {
		return err
	}
	p.standby = s
	return nil
}

func (p *pair) close() error {
	var errs []error
	for _, c := range append(p.dead, p.primary, p.standby) {
		if c != nil {
			errs = append(errs, c.Destroy())
		}
	}
	return errors.Join(errs...)
}
