// This file is an itx addition to blues/jsonata-go v1.5.4 (see PATCHES.md).

package jlib

import (
	"fmt"
	"reflect"
)

// MaxStringBytes and MaxArrayItems bound what one built-in function may build: a string, an
// array. Zero is no bound. They are process-wide; set them once, before any evaluation (the
// jsonata package's SetSizeLimits does).
var (
	MaxStringBytes int
	MaxArrayItems  int
)

// SizeError reports a value past one of the bounds.
type SizeError struct {
	What string
	Max  int
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("evaluation exceeded its %s limit of %d", e.What, e.Max)
}

// CheckStringBytes refuses a string of n bytes past MaxStringBytes.
func CheckStringBytes(n int) error {
	if MaxStringBytes > 0 && n > MaxStringBytes {
		return &SizeError{What: "string size", Max: MaxStringBytes}
	}
	return nil
}

// CheckArrayItems refuses an array of n items past MaxArrayItems.
func CheckArrayItems(n int) error {
	if MaxArrayItems > 0 && n > MaxArrayItems {
		return &SizeError{What: "array size", Max: MaxArrayItems}
	}
	return nil
}

// CheckEncodedSize refuses a value whose JSON encoding would exceed max bytes, without encoding
// it. The walk counts a sub-value each time it is reached, as an encoder would: a structure
// that shares itself (an array holding the same array twice, n levels deep) costs 2^n, and the
// walk stops as soon as the budget is spent, so it is bounded by max too.
func CheckEncodedSize(v interface{}, max int) error {
	if max <= 0 {
		return nil
	}
	budget := max
	if !walkSize(reflect.ValueOf(v), &budget) {
		return &SizeError{What: "result size", Max: max}
	}
	return nil
}

func walkSize(v reflect.Value, budget *int) bool {
	for v.IsValid() && (v.Kind() == reflect.Interface || v.Kind() == reflect.Ptr) {
		if v.IsNil() {
			break
		}
		v = v.Elem()
	}
	*budget--
	if !v.IsValid() {
		return *budget >= 0
	}
	switch v.Kind() {
	case reflect.String:
		*budget -= v.Len() + 1
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			*budget -= v.Len()
			break
		}
		for i := 0; i < v.Len() && *budget >= 0; i++ {
			if !walkSize(v.Index(i), budget) {
				return false
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for *budget >= 0 && it.Next() {
			*budget -= 3
			if !walkSize(it.Key(), budget) || !walkSize(it.Value(), budget) {
				return false
			}
		}
	case reflect.Struct:
		for i := 0; i < v.NumField() && *budget >= 0; i++ {
			if !walkSize(v.Field(i), budget) {
				return false
			}
		}
	default:
		*budget -= 4 // a number, a boolean
	}
	return *budget >= 0
}
