package processors

import "github.com/itx-dev/itx"

// The host ports are the vocabulary's (package itx), so a host names them without importing
// this package.
type (
	StreamLog     = itx.ProcessorLog
	Page          = itx.ProcessorPage
	Frame         = itx.ProcessorFrame
	Progress      = itx.ProcessorProgress
	ProgressStore = itx.ProcessorProgressStore
	KV            = itx.ProcessorKV
	AlarmCell     = itx.ProcessorAlarm
	RuntimeState  = itx.ProcessorRuntimeState
	Hosted        = itx.ProcessorRunner
)
