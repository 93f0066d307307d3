//! A backend behind hooks on its acquisition and extension replies, for tests that play a
//! network which loses, delays or holds back those replies: every other call reaches the inner
//! backend unchanged.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{
    AcquireRequest, Attempt, Backend, Capabilities, LockInfo, LockName, ReleaseSubscription,
    Released, Token,
};

/// What a test changes about the replies; each default passes the call straight through.
#[async_trait]
pub trait Hooks: Send + Sync + fmt::Debug + 'static {
    /// An acquisition attempt, sent on to `inner` (or not) as the network would.
    async fn acquire(
        &self,
        inner: &Arc<dyn Backend>,
        request: &AcquireRequest,
    ) -> distlock::Result<Attempt> {
        inner.acquire(request).await
    }
    /// An extension, sent on to `inner` (or not) as the network would.
    async fn extend(
        &self,
        inner: &Arc<dyn Backend>,
        name: &LockName,
        token: Token,
        lease: Duration,
    ) -> distlock::Result<bool> {
        inner.extend(name, token, lease).await
    }
}

/// `inner` behind `hooks`; it derefs to the hooks, so a test reaches their state directly.
#[derive(Debug)]
pub struct Hooked<H> {
    /// The backend every call reaches in the end.
    pub inner: Arc<dyn Backend>,
    /// What the test changes.
    pub hooks: H,
}

impl<H> Hooked<H> {
    /// `inner` behind `hooks`.
    pub fn wrap(inner: Arc<dyn Backend>, hooks: H) -> Self {
        Hooked { inner, hooks }
    }
}

impl<H> Deref for Hooked<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hooks
    }
}

#[async_trait]
impl<H: Hooks> Backend for Hooked<H> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, request: &AcquireRequest) -> distlock::Result<Attempt> {
        self.hooks.acquire(&self.inner, request).await
    }
    async fn release(&self, name: &LockName, token: Token) -> distlock::Result<Released> {
        self.inner.release(name, token).await
    }
    async fn extend(
        &self,
        name: &LockName,
        token: Token,
        lease: Duration,
    ) -> distlock::Result<bool> {
        self.hooks.extend(&self.inner, name, token, lease).await
    }
    async fn subscribe(
        &self,
        name: &LockName,
        waiter: Token,
    ) -> distlock::Result<ReleaseSubscription> {
        self.inner.subscribe(name, waiter).await
    }
    async fn leave_queue(&self, name: &LockName, token: Token) -> distlock::Result<()> {
        self.inner.leave_queue(name, token).await
    }
    async fn force_release(&self, name: &LockName) -> distlock::Result<bool> {
        self.inner.force_release(name).await
    }
    async fn inspect(&self, name: &LockName) -> distlock::Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}
