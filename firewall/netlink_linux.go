package firewall

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/storeguard/storeguard/nftset"
)

// Target is the network namespace to work in: the process's own when NetNS is nil.
type Target struct{ NetNS *os.File }

func (t Target) conn() (*nftables.Conn, error) { return nftset.Open(t.NetNS) }

// loIndex is loopback's interface index, 1 in every network namespace (the kernel registers it
// first); nft resolves iif "lo" to it as it loads a file, as this does.
const loIndex = 1

// ruleset is a table as the files write it: its sets, then its chains with their rules.
type ruleset struct {
	table  *nftables.Table
	keep   bool // peers: keep the table and its sets (and their addresses), replace the chain's rules
	sets   []*nftables.Set
	chains []chainRules
}

type chainRules struct {
	chain *nftables.Chain
	rules []rule
}

type rule struct {
	exprs   []expr.Any
	comment string
	anon    *nftables.Set // an anonymous set the rule looks up (connect with several master ports)
	anonKey []nftables.SetElement
}

func build(name string, v Values) (*ruleset, error) {
	if err := v.Validate(name); err != nil {
		return nil, err
	}
	tname, _ := Table(name)
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tname}
	accept := nftables.ChainPolicyAccept
	filterInput := &nftables.Chain{Table: t, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	rs := &ruleset{table: t}
	switch name {
	case "sidecar":
		pre := &nftables.Chain{Table: t, Name: "prerouting", Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}
		rs.chains = []chainRules{
			{pre, []rule{{exprs: cat(notLoopback(expr.MetaKeyIIF), fibLocal(), tcpDport(v.StorePort), counter(), redirect(v.ProxyPort)),
				comment: "storeguard: remote -> proxy"}}},
			{filterInput, []rule{{exprs: cat(notLoopback(expr.MetaKeyIIF), tcpDport(v.StorePort), counter(), verdict(expr.VerdictDrop)),
				comment: "storeguard: store port is loopback-only"}}},
		}
	case "explicit":
		rs.chains = []chainRules{
			{filterInput, []rule{{exprs: cat(notLoopback(expr.MetaKeyIIF), tcpDport(v.PrivatePort), counter(), verdict(expr.VerdictDrop)),
				comment: "storeguard: private store port is loopback-only"}}},
		}
	case "connect":
		out := &nftables.Chain{Table: t, Name: "output", Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Policy: &accept}
		redir := rule{comment: "storeguard-connect: rank -> client guard"}
		ports := tcpDport(v.MasterPorts[0])
		if len(v.MasterPorts) > 1 {
			redir.anon = &nftables.Set{Table: t, Anonymous: true, Constant: true, KeyType: nftables.TypeInetService}
			for _, p := range v.MasterPorts {
				redir.anonKey = append(redir.anonKey, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
			}
			ports = cat(tcpProto(), dport(), []expr.Any{&expr.Lookup{SourceRegister: 1}})
		}
		redir.exprs = cat(notLoopback(expr.MetaKeyOIF),
			cmpMeta(expr.MetaKeySKUID, expr.CmpOpNeq, binaryutil.NativeEndian.PutUint32(v.GuardUID)),
			cmpMeta(expr.MetaKeyMARK, expr.CmpOpNeq, binaryutil.NativeEndian.PutUint32(v.GuardMark)),
			ports, counter(), redirect(v.ConnectPort))
		rs.chains = []chainRules{
			{out, []rule{redir}},
			{filterInput, []rule{{exprs: cat(notLoopback(expr.MetaKeyIIF), tcpDport(v.ConnectPort), counter(), verdict(expr.VerdictDrop)),
				comment: "storeguard-connect: connect port is loopback-only"}}},
		}
	case "peers":
		rs.keep = true
		peers := &nftables.Set{Table: t, Name: "peers", KeyType: nftables.TypeIPAddr, HasTimeout: true}
		peers6 := &nftables.Set{Table: t, Name: "peers6", KeyType: nftables.TypeIP6Addr, HasTimeout: true}
		static := &nftables.Set{Table: t, Name: "static_peers", KeyType: nftables.TypeIPAddr, Interval: true}
		static6 := &nftables.Set{Table: t, Name: "static_peers6", KeyType: nftables.TypeIP6Addr, Interval: true}
		rs.sets = []*nftables.Set{peers, peers6, static, static6}
		const exceptions = "storeguard: the operator's own exceptions (other NICs of job hosts)"
		const freePorts = "storeguard: free ports, hosts that proved who they are only"
		newFree := cat(notLoopback(expr.MetaKeyIIF), ctNew(), tcpProto(), dport(),
			[]expr.Any{
				&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: binaryutil.BigEndian.PutUint16(v.FreePorts[0])},
				&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: binaryutil.BigEndian.PutUint16(v.FreePorts[1])},
			})
		rs.chains = []chainRules{{filterInput, []rule{
			{exprs: cat(saddr(unix.NFPROTO_IPV4, static, false), verdict(expr.VerdictAccept)), comment: exceptions},
			{exprs: cat(saddr(unix.NFPROTO_IPV6, static6, false), verdict(expr.VerdictAccept)), comment: exceptions},
			{exprs: cat(newFree, saddr(unix.NFPROTO_IPV4, peers, true), counter(), verdict(expr.VerdictDrop)), comment: freePorts},
			{exprs: cat(newFree, saddr(unix.NFPROTO_IPV6, peers6, true), counter(), verdict(expr.VerdictDrop)), comment: freePorts},
		}}}
	}
	return rs, nil
}

// Install loads the ruleset in one transaction: the table replaced whole (peers: its chain's
// rules replaced, its sets and their addresses kept).
func Install(tg Target, name string, v Values) error {
	rs, err := build(name, v)
	if err != nil {
		return err
	}
	c, err := tg.conn()
	if err != nil {
		return err
	}
	c.AddTable(rs.table)
	if !rs.keep {
		c.DelTable(rs.table)
		c.AddTable(rs.table)
	}
	named := map[string]*nftables.Set{}
	for _, s := range rs.sets {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
		named[s.Name] = s
	}
	for _, ch := range rs.chains {
		c.AddChain(ch.chain)
		if rs.keep {
			c.FlushChain(ch.chain)
		}
		for _, r := range ch.rules {
			if r.anon != nil {
				if err := c.AddSet(r.anon, r.anonKey); err != nil {
					return err
				}
			}
			for _, e := range r.exprs {
				l, ok := e.(*expr.Lookup)
				if !ok {
					continue
				}
				set := named[l.SetName]
				if r.anon != nil {
					set = r.anon
				}
				if set != nil {
					l.SetName, l.SetID = set.Name, set.ID
				}
			}
			c.AddRule(&nftables.Rule{Table: rs.table, Chain: ch.chain, Exprs: r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install %s (table inet %s): %w", name, rs.table.Name, err)
	}
	return nil
}

// Remove deletes the ruleset's table; nothing when there is none.
func Remove(tg Target, name string) error {
	tname, err := Table(name)
	if err != nil {
		return err
	}
	c, err := tg.conn()
	if err != nil {
		return err
	}
	if _, err := c.ListTableOfFamily(tname, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file") {
			return nil
		}
		return fmt.Errorf("remove %s: %w", name, err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: tname})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove %s (table inet %s): %w", name, tname, err)
	}
	return nil
}

// Check says how the loaded table differs from what Install(name, v) loads: a missing table, set
// or chain, a chain of another type, hook or priority, and a rule missing, added or changed
// (compared expression by expression, with the counters' values and set ids left out). When it
// is the same, it gives what each counting rule counted.
func Check(tg Target, name string, v Values) ([]Count, error) {
	rs, err := build(name, v)
	if err != nil {
		return nil, err
	}
	c, err := tg.conn()
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("table inet %s", rs.table.Name)
	if _, err := c.ListTableOfFamily(rs.table.Name, nftables.TableFamilyINet); err != nil {
		return nil, fmt.Errorf("%s: not loaded (%v)", where, err)
	}
	var counts []Count
	for _, s := range rs.sets {
		got, err := c.GetSetByName(rs.table, s.Name)
		if err != nil {
			return nil, fmt.Errorf("%s: set %s: missing (%v)", where, s.Name, err)
		}
		if got.KeyType.Name != s.KeyType.Name || got.HasTimeout != s.HasTimeout || got.Interval != s.Interval {
			return nil, fmt.Errorf("%s: set %s: type %s, timeout %v, interval %v; want %s, %v, %v", where, s.Name,
				got.KeyType.Name, got.HasTimeout, got.Interval, s.KeyType.Name, s.HasTimeout, s.Interval)
		}
	}
	for _, ch := range rs.chains {
		got, err := c.ListChain(rs.table, ch.chain.Name)
		if err != nil {
			return nil, fmt.Errorf("%s: chain %s: missing (%v)", where, ch.chain.Name, err)
		}
		if got.Type != ch.chain.Type || got.Hooknum == nil || *got.Hooknum != *ch.chain.Hooknum ||
			got.Priority == nil || *got.Priority != *ch.chain.Priority {
			return nil, fmt.Errorf("%s: chain %s: not a %s chain on hook %d at priority %d", where, ch.chain.Name,
				ch.chain.Type, *ch.chain.Hooknum, *ch.chain.Priority)
		}
		rules, err := c.GetRules(rs.table, ch.chain)
		if err != nil {
			return nil, fmt.Errorf("%s: chain %s: %w", where, ch.chain.Name, err)
		}
		if len(rules) != len(ch.rules) {
			return nil, fmt.Errorf("%s: chain %s: %d rules, want %d", where, ch.chain.Name, len(rules), len(ch.rules))
		}
		for i, r := range ch.rules {
			comment, _ := userdata.GetString(rules[i].UserData, userdata.TypeComment)
			if comment != r.comment || !sameExprs(rules[i].Exprs, r.exprs) {
				return nil, fmt.Errorf("%s: chain %s: rule %d (%q) is not the one storeguard loads with these values", where, ch.chain.Name, i+1, comment)
			}
			for _, e := range rules[i].Exprs {
				if n, ok := e.(*expr.Counter); ok {
					counts = append(counts, Count{Chain: ch.chain.Name, Comment: comment, Packets: n.Packets, Bytes: n.Bytes})
				}
			}
		}
	}
	return counts, nil
}

// Count is what a rule with a counter counted.
type Count struct {
	Chain, Comment string
	Packets, Bytes uint64
}

// sameExprs compares two rules' expressions, but for what the kernel fills in or numbers itself.
func sameExprs(got, want []expr.Any) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range want {
		g, w := got[i], want[i]
		if reflect.TypeOf(g) != reflect.TypeOf(w) {
			return false
		}
		switch w := w.(type) {
		case *expr.Counter:
			continue
		case *expr.Lookup:
			g := g.(*expr.Lookup)
			if g.Invert != w.Invert || g.SourceRegister != w.SourceRegister ||
				(w.SetName != "" && !strings.HasPrefix(w.SetName, "__set") && g.SetName != w.SetName) {
				return false
			}
			continue
		case *expr.Redir: // the kernel gives a range of one port its end
			g := *g.(*expr.Redir)
			if g.RegisterProtoMax == g.RegisterProtoMin && w.RegisterProtoMax == 0 {
				g.RegisterProtoMax = 0
			}
			if g != *w {
				return false
			}
			continue
		}
		if !reflect.DeepEqual(g, w) {
			return false
		}
	}
	return true
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// notLoopback: iif (oif) != "lo".
func notLoopback(key expr.MetaKey) []expr.Any {
	return cmpMeta(key, expr.CmpOpNeq, binaryutil.NativeEndian.PutUint32(loIndex))
}

func cmpMeta(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

// fibLocal: fib daddr type local.
func fibLocal() []expr.Any {
	return []expr.Any{&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)}}
}

func tcpProto() []expr.Any {
	return cmpMeta(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{unix.IPPROTO_TCP})
}

func dport() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

// tcpDport: tcp dport p (several ports are looked up in an anonymous set by the caller).
func tcpDport(p uint16) []expr.Any {
	return cat(tcpProto(), dport(), []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)}})
}

// ctNew: ct state new.
func ctNew() []expr.Any {
	return []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}}
}

// saddr: ip saddr (!=) @set, or ip6 saddr (!=) @set.
func saddr(proto byte, set *nftables.Set, invert bool) []expr.Any {
	off, n := uint32(12), uint32(4)
	if proto == unix.NFPROTO_IPV6 {
		off, n = 8, 16
	}
	return append(cmpMeta(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{proto}),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, Invert: invert})
}

func counter() []expr.Any { return []expr.Any{&expr.Counter{}} }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// redirect: redirect to :port.
func redirect(port uint16) []expr.Any {
	return []expr.Any{&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED}}
}
