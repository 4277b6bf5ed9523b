package repl

import (
	"fmt"
	"sort"
	"sync"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/schemas"
	cschema "capnproto.org/go/capnp/v3/std/capnp/schema"
	"github.com/itx-dev/itx/schema"
)

// Method is one method of a capability interface, read from the compiled schema.
type Method struct {
	Name string
	// Returns names the interface of the method's only result when that result is a capability
	// (Streams.get -> "Stream"); empty otherwise.
	Returns string
	// Property is set for a navigation step without parameters (Project.streams,
	// Stream.subscriptions): the JS surface exposes it as a property, as the itx TypeScript
	// surface does (project.streams.get(path)), not as a method call.
	Property bool
	// Params lists the parameter names, in declaration order.
	Params []string
}

// Interface is a capability interface of the itx schema.
type Interface struct {
	Name    string
	Methods []Method // in declaration order
}

// Method returns the named method.
func (i *Interface) Method(name string) (Method, bool) {
	for _, m := range i.Methods {
		if m.Name == name {
			return m, true
		}
	}
	return Method{}, false
}

var (
	schemaOnce sync.Once
	schemaIfcs map[string]*Interface
	schemaErr  error
)

// Interfaces returns every interface of schema/itx.capnp by name, read from the schema the
// generated code embeds: completion and property-style navigation follow the schema, so a
// method added there is offered without a change here.
func Interfaces() (map[string]*Interface, error) {
	schemaOnce.Do(func() { schemaIfcs, schemaErr = loadInterfaces() })
	return schemaIfcs, schemaErr
}

func loadInterfaces() (map[string]*Interface, error) {
	var reg schemas.Registry
	schema.RegisterSchema(&reg)
	data, err := reg.Find(schema.Stream_TypeID)
	if err != nil {
		return nil, fmt.Errorf("load schema: %w", err)
	}
	msg, err := capnp.Unmarshal(data)
	if err != nil {
		return nil, fmt.Errorf("load schema: %w", err)
	}
	req, err := cschema.ReadRootCodeGeneratorRequest(msg)
	if err != nil {
		return nil, fmt.Errorf("load schema: %w", err)
	}
	nodes, err := req.Nodes()
	if err != nil {
		return nil, fmt.Errorf("load schema: %w", err)
	}
	byID := make(map[uint64]cschema.Node, nodes.Len())
	for i := 0; i < nodes.Len(); i++ {
		byID[nodes.At(i).Id()] = nodes.At(i)
	}
	name := func(n cschema.Node) string {
		dn, _ := n.DisplayName()
		return dn[n.DisplayNamePrefixLength():]
	}
	fields := func(id uint64) []cschema.Field {
		n, ok := byID[id]
		if !ok || n.Which() != cschema.Node_Which_structNode {
			return nil
		}
		list, err := n.StructNode().Fields()
		if err != nil {
			return nil
		}
		out := make([]cschema.Field, list.Len())
		for i := range out {
			out[i] = list.At(i)
		}
		return out
	}
	out := make(map[string]*Interface)
	for _, n := range byID {
		if n.Which() != cschema.Node_Which_interface {
			continue
		}
		ifc := &Interface{Name: name(n)}
		methods, err := n.Interface().Methods()
		if err != nil {
			return nil, fmt.Errorf("load schema: %s: %w", ifc.Name, err)
		}
		for i := 0; i < methods.Len(); i++ {
			m := methods.At(i)
			mname, _ := m.Name()
			method := Method{Name: mname}
			params := fields(m.ParamStructType())
			for _, f := range params {
				pname, _ := f.Name()
				method.Params = append(method.Params, pname)
			}
			if results := fields(m.ResultStructType()); len(results) == 1 && results[0].Which() == cschema.Field_Which_slot {
				if t, err := results[0].Slot().Type(); err == nil && t.Which() == cschema.Type_Which_interface {
					if target, ok := byID[t.Interface().TypeId()]; ok {
						method.Returns = name(target)
						method.Property = len(params) == 0
					}
				}
			}
			ifc.Methods = append(ifc.Methods, method)
		}
		out[ifc.Name] = ifc
	}
	return out, nil
}

// memberNames lists what the JS surface offers on an interface: properties bare, methods with
// an opening parenthesis, sorted.
func memberNames(ifc *Interface) []string {
	var out []string
	for _, m := range ifc.Methods {
		if m.Property {
			out = append(out, m.Name)
		} else {
			out = append(out, m.Name+"(")
		}
	}
	sort.Strings(out)
	return out
}
