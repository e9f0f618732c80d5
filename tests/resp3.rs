//! RESP3 through respway: after `HELLO 3`, every reply has the bytes (and so the RESP3 type)
//! a plain redis-server sends for the same command, whether Redis produced it on a shard or
//! respway merged it (MGET, DEL, EXISTS, SCRIPT EXISTS) or made it (CLIENT GETNAME, errors).
//! Also per-client databases (SELECT) and the protocol switch inside one session.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::support::*;
use bytes::BytesMut;
use respway_filters::codec_limits::Limits;
use respway_filters::resp::reply_len;

/// A raw connection that returns each reply's exact bytes.
struct Raw {
    s: TcpStream,
    buf: BytesMut,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Raw {
            s,
            buf: BytesMut::new(),
        }
    }

    fn call(&mut self, args: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        let a: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        encode_cmd(&mut out, &a);
        self.s.write_all(&out).expect("write");
        loop {
            if let Some(n) = reply_len(&self.buf, &Limits::default()).expect("valid RESP") {
                return self.buf.split_to(n).to_vec();
            }
            let mut chunk = [0u8; 65536];
            let n = self.s.read(&mut chunk).expect("read");
            assert!(n > 0, "closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn three_shards() -> (Vec<Proc>, Respway) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: crc16_slots }", true), 1);
    (shards, rw)
}

/// Commands over every data type, their replies compared byte for byte.
const COMMANDS: &[&[&str]] = &[
    &["SET", "str", "v"],
    &["GET", "str"],
    &["GET", "missing"],
    &["INCRBYFLOAT", "fl", "1.5"],
    &["SET", "n", "10"],
    &["INCR", "n"],
    &["GETRANGE", "str", "0", "-1"],
    &["STRLEN", "str"],
    &["TTL", "str"],
    &["TYPE", "str"],
    &["MSET", "m1", "a", "m2", "b", "m3", "c"],
    &["MGET", "m1", "missing", "m2", "m3", "str"],
    &["EXISTS", "m1", "m2", "nope"],
    &["HSET", "h", "f1", "v1", "f2", "v2"],
    &["HGETALL", "h"],
    &["HGET", "h", "f1"],
    &["HGET", "h", "nope"],
    &["HMGET", "h", "f1", "nope"],
    &["HEXISTS", "h", "f1"],
    &["HKEYS", "h"],
    &["HINCRBYFLOAT", "h", "fl", "2.25"],
    &["SADD", "s", "3", "1", "2"],
    &["SMEMBERS", "s"],
    &["SISMEMBER", "s", "1"],
    &["SMISMEMBER", "s", "1", "z"],
    &["SINTER", "s"],
    &["ZADD", "z", "1.5", "m1", "2", "m2", "3.25", "m3"],
    &["ZSCORE", "z", "m1"],
    &["ZSCORE", "z", "nope"],
    &["ZMSCORE", "z", "m1", "nope"],
    &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
    &["ZRANGE", "z", "0", "-1"],
    &["ZINCRBY", "z", "1", "m1"],
    &["ZRANK", "z", "m2"],
    &["ZPOPMIN", "z"],
    &["ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES"],
    &["RPUSH", "l", "a", "b", "c"],
    &["LRANGE", "l", "0", "-1"],
    &["LPOS", "l", "b"],
    &["LPOP", "l", "2"],
    &["LPOP", "nolist"],
    &["XADD", "x", "1-1", "f", "v"],
    &["XADD", "x", "2-1", "f", "w"],
    &["XRANGE", "x", "-", "+"],
    &["XLEN", "x"],
    &["GEOADD", "g", "13.361389", "38.115556", "Palermo"],
    &["GEOPOS", "g", "Palermo", "nope"],
    &["GEODIST", "g", "Palermo", "Palermo"],
    &["PFADD", "hll", "a", "b"],
    &["PFCOUNT", "hll"],
    &["SETBIT", "bits", "7", "1"],
    &["BITCOUNT", "bits"],
    &["OBJECT", "ENCODING", "s"],
    &["EXPIRE", "str", "100"],
    &["PERSIST", "str"],
    &["HGET", "str", "f"],
    &["EVAL", "return {1, 'two', false, true}", "1", "str"],
    &["EVAL", "return redis.call('HGETALL', KEYS[1])", "1", "h"],
    &[
        "EVAL",
        "redis.setresp(3); return redis.call('HGETALL', KEYS[1])",
        "1",
        "h",
    ],
    &["SCRIPT", "LOAD", "return 1"],
    &[
        "SCRIPT",
        "EXISTS",
        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
        "ffffffffffffffffffffffffffffffffffffffff",
    ],
    &["CLIENT", "GETNAME"],
    &["CLIENT", "SETNAME", "me"],
    &["CLIENT", "GETNAME"],
    &["PING"],
    &["PING", "hello"],
    &["ECHO", "x"],
    &["DEL", "m1", "m2", "m3", "nope"],
    &["UNLINK", "h"],
    &["NOSUCHCOMMAND"],
    &["GET"],
];

/// Every reply to a RESP3 client equals the plain redis-server's, byte for byte.
#[test]
fn resp3_replies_equal_plain_redis_type_for_type() {
    let (_shards, rw) = three_shards();
    let plain = redis();
    let mut p = Raw::connect(plain.addr);
    let mut r = Raw::connect(rw.addr);
    let hp = p.call(&["HELLO", "3"]);
    let hr = r.call(&["HELLO", "3"]);
    assert_eq!(
        hr[0],
        b'%',
        "HELLO 3 answers a map: {}",
        String::from_utf8_lossy(&hr)
    );
    assert_eq!(hp[0], hr[0]);
    for cmd in COMMANDS {
        let want = p.call(cmd);
        let got = r.call(cmd);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{cmd:?}"
        );
    }
    // Replies respway writes itself have Redis's RESP3 types: INFO is a verbatim string.
    assert_eq!(r.call(&["INFO", "server"])[0], b'=');
    assert_eq!(r.call(&["CLIENT", "INFO"])[0], b'=');
    // Back to RESP2 in the same session: replies are RESP2 again.
    let h2 = r.call(&["HELLO", "2"]);
    assert_eq!(h2[0], b'*');
    p.call(&["HELLO", "2"]);
    assert_eq!(r.call(&["HGETALL", "nohash"]), b"*0\r\n");
    assert_eq!(r.call(&["GET", "missing"]), b"$-1\r\n");
    assert_eq!(
        r.call(&["ZSCORE", "z", "m3"]),
        p.call(&["ZSCORE", "z", "m3"])
    );
    assert_eq!(r.call(&["ZSCORE", "z", "m3"]), b"$4\r\n3.25\r\n");
}

/// The same commands as a RESP2 client: equal too (the RESP2 path is unchanged).
#[test]
fn resp2_replies_equal_plain_redis() {
    let (_shards, rw) = three_shards();
    let plain = redis();
    let mut p = Raw::connect(plain.addr);
    let mut r = Raw::connect(rw.addr);
    for cmd in COMMANDS {
        let want = p.call(cmd);
        let got = r.call(cmd);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{cmd:?}"
        );
    }
}

/// HELLO answers like Redis 7 with the advertised version; a listener can refuse or
/// require RESP3 (Envoy's `protocol_version`).
#[test]
fn hello_and_protocol_modes() {
    let (shards, rw) = three_shards();
    let mut r = RespConn::connect(rw.addr);
    let Resp::Other(b'%', kv) = r.call(&["HELLO", "3", "SETNAME", "app"]) else {
        panic!("HELLO 3 is a map");
    };
    let texts: Vec<String> = kv
        .iter()
        .map(|v| match v {
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            Resp::Int(n) => n.to_string(),
            _ => String::new(),
        })
        .collect();
    for (k, v) in [
        ("server", "redis"),
        ("version", respway_filters::command::REDIS_VERSION),
        ("proto", "3"),
        ("mode", "standalone"),
        ("role", "master"),
    ] {
        let i = texts
            .iter()
            .position(|t| t == k)
            .unwrap_or_else(|| panic!("{k} in {texts:?}"));
        assert_eq!(texts[i + 1], v, "{k}");
    }
    assert_eq!(r.call(&["CLIENT", "GETNAME"]), Resp::bulk("app"));
    assert!(r
        .call(&["HELLO", "4"])
        .error()
        .unwrap_or("")
        .starts_with("NOPROTO"));
    drop(rw);
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let yaml = sharded_yaml(&addrs, "{ policy: crc16_slots }", true);
    let only2 = respway(
        &yaml.replace(
            "    op_timeout: 2s\n",
            "    op_timeout: 2s\n    protocol: resp2\n    advertised_redis_version: \"7.2.4\"\n",
        ),
        1,
    );
    let mut c = RespConn::connect(only2.addr);
    assert!(c
        .call(&["HELLO", "3"])
        .error()
        .unwrap_or("")
        .starts_with("NOPROTO"));
    let Resp::Array(Some(kv)) = c.call(&["HELLO", "2"]) else {
        panic!("HELLO 2 is an array")
    };
    assert_eq!(kv[3], Resp::bulk("7.2.4"));
    assert!(c
        .call(&["INFO", "server"])
        .text()
        .contains("redis_version:7.2.4"));
    let only3 = respway(
        &yaml.replace(
            "    op_timeout: 2s\n",
            "    op_timeout: 2s\n    protocol: resp3\n",
        ),
        1,
    );
    let mut c = RespConn::connect(only3.addr);
    assert!(c
        .call(&["GET", "k"])
        .error()
        .unwrap_or("")
        .starts_with("NOPROTO"));
    assert!(matches!(c.call(&["HELLO", "3"]), Resp::Other(b'%', _)));
    assert_eq!(c.call(&["GET", "k"]), Resp::Bulk(None));
}

/// SELECT n: a client's database n is the shards' database n, on every shard; db 0 does not
/// see it; the cap is the cluster's `databases`.
#[test]
fn select_isolates_databases_on_every_shard() {
    let (shards, rw) = three_shards();
    let mut db1 = RespConn::connect(rw.addr);
    let mut db0 = RespConn::connect(rw.addr);
    assert_eq!(db1.call(&["SELECT", "1"]), Resp::Simple("OK".into()));
    let keys: Vec<String> = (0..30).map(|i| format!("sel:{i}")).collect();
    for k in &keys {
        assert_eq!(db1.call(&["SET", k, "one"]), Resp::Simple("OK".into()));
    }
    for k in &keys {
        assert_eq!(
            db0.call(&["GET", k]),
            Resp::Bulk(None),
            "{k} leaked into db 0"
        );
        assert_eq!(db1.call(&["GET", k]), Resp::bulk("one"));
    }
    let mut on_shards = 0;
    for s in &shards {
        let mut c = RespConn::connect(s.addr);
        assert_eq!(c.call(&["DBSIZE"]), Resp::Int(0), "db 0 of {}", s.addr);
        c.call(&["SELECT", "1"]);
        if let Resp::Int(n) = c.call(&["DBSIZE"]) {
            assert!(n > 0, "every shard has some of db 1");
            on_shards += n;
        }
    }
    assert_eq!(on_shards, 30);
    assert_eq!(
        db1.call(&["SELECT", "16"]),
        Resp::Error("ERR DB index is out of range".into())
    );
    assert_eq!(db1.call(&["SELECT", "0"]), Resp::Simple("OK".into()));
    assert_eq!(db1.call(&["GET", "sel:1"]), Resp::Bulk(None));
    // A transaction in db 1 runs in db 1.
    db1.call(&["SELECT", "1"]);
    assert_eq!(db1.call(&["MULTI"]), Resp::Simple("OK".into()));
    db1.call(&["INCR", "{x}n"]);
    assert_eq!(db1.call(&["EXEC"]), Resp::Array(Some(vec![Resp::Int(1)])));
    assert_eq!(db0.call(&["GET", "{x}n"]), Resp::Bulk(None));
}

/// The `redis` crate over RESP3 (`?protocol=resp3`) and RESP2, through respway: maps, sets,
/// doubles and nulls arrive typed; an atomic pipeline commits; MGET across shards merges.
#[test]
fn redis_crate_with_resp3_and_resp2() {
    use redis::Value;
    let (_shards, rw) = three_shards();
    for (url, resp3) in [
        (format!("redis://{}/?protocol=resp3", rw.addr), true),
        (format!("redis://{}/", rw.addr), false),
    ] {
        let client = redis::Client::open(url).expect("client");
        let mut c = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect");
        let _: () = redis::cmd("HSET")
            .arg("ch")
            .arg("f")
            .arg("v")
            .query(&mut c)
            .unwrap();
        let _: () = redis::cmd("SADD").arg("cs").arg("1").query(&mut c).unwrap();
        let _: () = redis::cmd("ZADD")
            .arg("cz")
            .arg("1.5")
            .arg("m")
            .query(&mut c)
            .unwrap();
        let h: Value = redis::cmd("HGETALL").arg("ch").query(&mut c).unwrap();
        let s: Value = redis::cmd("SMEMBERS").arg("cs").query(&mut c).unwrap();
        let z: Value = redis::cmd("ZSCORE")
            .arg("cz")
            .arg("m")
            .query(&mut c)
            .unwrap();
        let n: Value = redis::cmd("GET").arg("nothing").query(&mut c).unwrap();
        if resp3 {
            assert!(matches!(h, Value::Map(_)), "{h:?}");
            assert!(matches!(s, Value::Set(_)), "{s:?}");
            assert_eq!(z, Value::Double(1.5));
        } else {
            assert!(matches!(h, Value::Array(_)), "{h:?}");
            assert!(matches!(s, Value::Array(_)), "{s:?}");
            assert!(matches!(z, Value::BulkString(_)), "{z:?}");
        }
        assert_eq!(n, Value::Nil);
        let (a, b): (i64, i64) = redis::pipe()
            .atomic()
            .cmd("INCR")
            .arg("{p}a")
            .cmd("INCR")
            .arg("{p}a")
            .query(&mut c)
            .unwrap();
        assert_eq!(b, a + 1);
        let keys: Vec<String> = (0..20).map(|i| format!("ck{i}")).collect();
        let mut m = redis::cmd("MSET");
        for k in &keys {
            m.arg(k).arg(k);
        }
        let _: () = m.query(&mut c).unwrap();
        let got: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .arg("none")
            .query(&mut c)
            .unwrap();
        let mut want: Vec<Option<String>> = keys.iter().cloned().map(Some).collect();
        want.push(None);
        assert_eq!(got, want);
    }
}
