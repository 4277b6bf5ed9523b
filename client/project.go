package client

import (
	"context"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// DescribeProject describes a project.
func DescribeProject(ctx context.Context, project schema.Project) (itx.ProjectInfo, error) {
	if err := NotSent(ctx, "DescribeProject"); err != nil {
		return itx.ProjectInfo{}, err
	}
	fut, release := project.Describe(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.ProjectInfo{}, err
	}
	i, err := res.Info()
	if err != nil {
		return itx.ProjectInfo{}, err
	}
	return wire.ProjectInfoFromSchema(i)
}

func mountInfos(list schema.MountInfo_List, err error) ([]itx.MountInfo, error) {
	if err != nil {
		return nil, err
	}
	return wire.MountInfosFromSchema(list)
}

// ListMounts lists the Receivers mounted in a project (project.capabilities().list()).
func ListMounts(ctx context.Context, caps schema.Capabilities) ([]itx.MountInfo, error) {
	if err := NotSent(ctx, "ListMounts"); err != nil {
		return nil, err
	}
	fut, release := caps.List(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	return mountInfos(res.Mounts())
}

// Unmount removes the Receiver mounted under name.
func Unmount(ctx context.Context, caps schema.Capabilities, name string) error {
	if err := NotSent(ctx, "Unmount"); err != nil {
		return err
	}
	fut, release := caps.Unmount(ctx, func(p schema.Capabilities_unmount_Params) error { return p.SetName(name) })
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// ProcessorHosts returns project.processors() at once, pipelined (see Stream): the remote
// processor hosts mounted in the project (processors/remote mounts one), for
// ListProcessorHosts. Release it when done.
func ProcessorHosts(ctx context.Context, project schema.Project) schema.ProcessorHosts {
	fut, release := project.Processors(lasting(ctx), nil)
	return keepAnswers(fut.Processors().AddRef(), release)
}

// ListProcessorHosts lists the remote ProcessorHosts mounted in a project.
func ListProcessorHosts(ctx context.Context, hosts schema.ProcessorHosts) ([]itx.MountInfo, error) {
	if err := NotSent(ctx, "ListProcessorHosts"); err != nil {
		return nil, err
	}
	fut, release := hosts.List(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	return mountInfos(res.Mounts())
}

// Readers returns stream.readers() at once, pipelined (see Stream). Release it when done.
func Readers(ctx context.Context, s schema.Stream) schema.Readers {
	fut, release := s.Readers(lasting(ctx), nil)
	return keepAnswers(fut.Readers().AddRef(), release)
}

// RegisterReader registers a named reader or moves its checkpoint.
func RegisterReader(ctx context.Context, readers schema.Readers, name string, checkpoint int64) error {
	if err := offsetArg("checkpoint", checkpoint); err != nil {
		return err
	}
	if err := NotSent(ctx, "RegisterReader"); err != nil {
		return err
	}
	fut, release := readers.Register(ctx, func(p schema.Readers_register_Params) error {
		p.SetCheckpoint(uint64(checkpoint))
		return p.SetName(name)
	})
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// ListReaders lists a stream's registered readers.
func ListReaders(ctx context.Context, readers schema.Readers) ([]itx.ReaderInfo, error) {
	if err := NotSent(ctx, "ListReaders"); err != nil {
		return nil, err
	}
	fut, release := readers.List(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	list, err := res.Readers()
	if err != nil {
		return nil, err
	}
	return wire.ReaderInfosFromSchema(list)
}

// RemoveReader removes a registered reader.
func RemoveReader(ctx context.Context, readers schema.Readers, name string) error {
	if err := NotSent(ctx, "RemoveReader"); err != nil {
		return err
	}
	fut, release := readers.Remove(ctx, func(p schema.Readers_remove_Params) error { return p.SetName(name) })
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// ProcessorSnapshot is a processor instance's reduced state and its two cursors.
type ProcessorSnapshot struct {
	State           string // JSON
	ReducedOffset   int64
	ProcessedOffset int64
}

// Snapshot reads a processor instance's reduced state.
func Snapshot(ctx context.Context, p schema.Processor) (ProcessorSnapshot, error) {
	if err := NotSent(ctx, "Snapshot"); err != nil {
		return ProcessorSnapshot{}, err
	}
	fut, release := p.Snapshot(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return ProcessorSnapshot{}, err
	}
	out := ProcessorSnapshot{ReducedOffset: int64(res.ReducedOffset()), ProcessedOffset: int64(res.ProcessedOffset())}
	out.State, err = res.State()
	return out, err
}

// RuntimeState reads a processor instance's runtime state: a JSON object whose fields the schema
// lists on Processor.getRuntimeState (itx.ProcessorRuntimeState decodes them).
func RuntimeState(ctx context.Context, p schema.Processor) (string, error) {
	if err := NotSent(ctx, "RuntimeState"); err != nil {
		return "", err
	}
	fut, release := p.GetRuntimeState(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return "", err
	}
	return res.State()
}
