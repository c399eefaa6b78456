//! The test servers themselves: a server started on a port another server holds is an
//! error, never that other server. (Before, its PING was taken for the new server's, and
//! two tests could share one server: one test's FLUSHALL emptied the other's keys.)

mod support;

use support::RedisServer;

#[test]
fn a_server_on_a_taken_port_is_an_error_not_the_other_server() {
    let a = RedisServer::start();
    redis::cmd("SET")
        .arg("mine")
        .arg("1")
        .exec(&mut a.conn())
        .unwrap();
    let port = a.port;
    let second = std::thread::spawn(move || RedisServer::start_on(port)).join();
    let e = second.err().expect("a second server on a taken port");
    let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("could not listen on port"), "{msg}");
    let v: String = redis::cmd("GET").arg("mine").query(&mut a.conn()).unwrap();
    assert_eq!(v, "1");
    // and a server on a free port is its own
    let b = RedisServer::start();
    assert_ne!(b.port, a.port);
}
