//! The servers that do nothing, which `http_bench` starts as its ceilings.

/// `--null-server [THREADS]`: the ceiling, a hyper server that does nothing, on a runtime like
/// the service's (two worker threads; 0: the current-thread runtime).
pub(crate) fn null_server(threads: usize) {
    use axum::body::Body;
    use hyper::{Method, Response, StatusCode};

    let runtime = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!(
            "null server: listening on http://{}",
            listener.local_addr().unwrap()
        );
        const GRANT: &[u8] =
            br#"{"key":"k","token":"00000000000000000000000000000000","fence":1024,"lease_ms":30000}"#;
        loop {
            let (tcp, _) = listener.accept().await.expect("accept");
            let _ = tcp.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let response = if req.method() == Method::POST {
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Body::from(GRANT))
                    } else {
                        Response::builder()
                            .status(StatusCode::NO_CONTENT)
                            .body(Body::empty())
                    };
                    response
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
}

/// `--null-axum`: an axum router whose handlers do nothing (POST answers a fixed grant, DELETE
/// 204), on a runtime like the service's: what the service's HTTP layer costs by itself.
pub(crate) fn null_axum() {
    use axum::http::StatusCode;
    use axum::routing::{delete, post};

    const GRANT: &str =
        r#"{"key":"k","token":"00000000000000000000000000000000","fence":1024,"lease_ms":30000}"#;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            println!(
                "null axum: listening on http://{}",
                listener.local_addr().unwrap()
            );
            let router = axum::Router::new()
                .route(
                    "/v1/locks/{key}",
                    post(|| async { ([("content-type", "application/json")], GRANT) }),
                )
                .route(
                    "/v1/locks/{key}/{token}",
                    delete(|| async { StatusCode::NO_CONTENT }),
                );
            axum::serve(listener, router).await.expect("serve");
        });
}
