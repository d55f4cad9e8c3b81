# Sourced by the bench scripts: HAProxy 2.6 in mode tcp, the reference proxy they measure beside
# storeguard.
#
# start_haproxy LISTEN UPSTREAM TAG MAXCONN: from 127.0.0.1:LISTEN to the store at 127.0.0.1:UPSTREAM,
# 2 threads, at most MAXCONN connections (it takes two descriptors each, and will not start past its
# descriptor limit); config $OUT/haproxy-TAG.cfg, log $OUT/logs/haproxy-TAG.log. Prints its pid.
# HAPROXY_ON, if set, prefixes the command (an exec-ing wrapper such as taskset -c CPUS).
start_haproxy() {
	cat >"$OUT/haproxy-$3.cfg" <<CFG
global
    maxconn $4
    nbthread 2
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    maxconn $4
frontend fe
    bind 127.0.0.1:$1
    default_backend be
backend be
    server store 127.0.0.1:$2 maxconn $4
CFG
	${HAPROXY_ON:-} haproxy -db -f "$OUT/haproxy-$3.cfg" >"$OUT/logs/haproxy-$3.log" 2>&1 &
	echo $!
}
