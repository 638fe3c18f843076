//! One raw HTTP/1.1 connection to the edge, for tests that must control the bytes
//! (pipelining, split requests, the fast lane's hand-over) or keep one connection
//! across requests.

/// A raw HTTP/1.1 connection, for tests that need to control the bytes or to keep
/// one connection across requests.
#[derive(Debug)]
pub struct RawHttp {
    pub stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

/// A parsed raw response.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl RawHttp {
    pub async fn connect(port: u16) -> Self {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await
    }

    /// Reads one response with a Content-Length body. `None` when the server closed
    /// the connection first.
    pub async fn response(&mut self) -> Option<RawResponse> {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let mut lines = head.split("\r\n");
                let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
                let headers: Vec<(String, String)> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .collect();
                let len: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                while self.buf.len() < end + 4 + len {
                    let mut chunk = [0u8; 4096];
                    let n = self.stream.read(&mut chunk).await.ok()?;
                    if n == 0 {
                        return None;
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                let body = self.buf[end + 4..end + 4 + len].to_vec();
                self.buf.drain(..end + 4 + len);
                return Some(RawResponse {
                    status,
                    headers,
                    body,
                });
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends a GET and reads its response.
    pub async fn get(&mut self, path: &str, extra_headers: &str) -> Option<RawResponse> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: gw\r\n{extra_headers}\r\n");
        self.send(req.as_bytes()).await.ok()?;
        self.response().await
    }

    /// True once the peer has closed the connection (read returns 0 or an error).
    pub async fn closed(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    }
}
