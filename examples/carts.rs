//! One owner per cart: an HTTP counter per cart, served by whichever silo holds
//! the cart's shard lease, on every silo of a cluster.
//!
//! ```text
//! cargo run --example carts --features redis -- redis://127.0.0.1:6379 shop 127.0.0.1:11111 127.0.0.1:8081
//! cargo run --example carts --features redis -- redis://127.0.0.1:6379 shop 127.0.0.1:11112 127.0.0.1:8082
//! curl -X POST 127.0.0.1:8082/cart/42/add/1     # request id 1: add one, answers the count
//! curl 127.0.0.1:8081/cart/42                   # the count, from either silo
//! ```
//!
//! Arguments: the store URL, the cluster id (also the reminder service id and
//! the state table), the silo's listen address, and the HTTP address (its
//! port is advertised in the silo's membership row: `Reminders::owner` names
//! it).
//!
//! - Each silo runs an actix-web front. A request for `cart/<id>` is served
//!   here when this silo holds the cart's shard (an [`ActorHost`] activates
//!   the cart, its state fenced by the shard's lease), else forwarded once to
//!   the owner's endpoint; `503` when there is none yet (a takeover): retry.
//! - `POST /cart/<id>/add/<request id>` adds one and answers the count. The
//!   cart keeps its last 64 request ids: a retried request (a timeout, a
//!   silo that died after its write landed) is applied once.
//! - A write of a cart whose shard another silo took over is refused by the
//!   store (`Error::Fenced`): nothing is acknowledged that the next owner
//!   does not read, and the stale activation is deactivated.
//! - On a graceful handoff the cart handles `Deactivate` after what its
//!   mailbox holds and stops; the shard's release waits for that.
//! - It prints `activated <actor> <epoch> <ms>`, `deactivated <actor>
//!   <epoch> <ms> <why>` and `fenced <actor> <epoch> <ms>` (a write the store
//!   refused) lines (UTC ms), and `ready <silo>` once serving.
//!   SIGTERM leaves gracefully (the shards are handed over) and exits 0; a
//!   silo that reads itself Dead (it was frozen or cut off while its peers
//!   declared it dead) exits 70. The HTTP port is bound before the silo
//!   advertises it.

use std::collections::VecDeque;
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, Message, WrapFuture,
};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use rollcall::reminders::{ActorHost, ActorId, HostError, HostEvent, Reminders};
use rollcall::state::{PersistentState, StateKey, StateStorage};
use rollcall::{Error, Fence, Silo};
use serde::{Deserialize, Serialize};

/// Request ids a cart remembers.
const RECENT: usize = 64;
/// The header a forwarded request carries (it is not forwarded again).
const FORWARDED: &str = "x-rollcall-forwarded";

#[derive(Default, Serialize, Deserialize)]
struct CartState {
    count: u64,
    recent: VecDeque<u64>,
}

/// One cart's activation.
struct Cart {
    state: PersistentState<CartState>,
    fence: Fence,
    actor: ActorId,
    host: Option<ActorHost<Cart>>,
}

impl Actor for Cart {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let state = self.state.clone();
        // No message is handled before the state is loaded.
        ctx.wait(
            async move { state.load().await }
                .into_actor(self)
                .map(|r, this, ctx| {
                    if let Err(e) = r {
                        eprintln!("carts: loading {}: {e}", this.actor);
                        ctx.stop();
                    }
                }),
        );
    }
}

/// Why a cart did not answer.
#[derive(Debug)]
enum CartError {
    /// Its shard moved: ask again (the front forwards).
    Moved,
    /// The store failed or timed out: ask again.
    Unavailable(String),
}

#[derive(Message)]
#[rtype(result = "Result<u64, CartError>")]
struct Add(u64);

#[derive(Message)]
#[rtype(result = "u64")]
struct Count;

impl Handler<Add> for Cart {
    /// Atomic: the cart handles its next message (another `Add`, a `Count`,
    /// `Deactivate`) only once this write has landed or failed, so a count
    /// never reads ahead of its store and a handoff never cuts a write short.
    type Result = AtomicResponse<Self, Result<u64, CartError>>;

    fn handle(&mut self, Add(request): Add, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.clone();
        AtomicResponse::new(Box::pin(
            async move {
                state
                    .update(|s| {
                        if !s.recent.contains(&request) {
                            s.count += 1;
                            s.recent.push_back(request);
                            while s.recent.len() > RECENT {
                                s.recent.pop_front();
                            }
                        }
                        s.count
                    })
                    .await
            }
            .into_actor(self)
            .map(|r, this, ctx| match r {
                Ok(n) => Ok(n),
                Err(Error::Fenced { .. }) => {
                    // Another silo owns the cart now: this activation ends.
                    println!("fenced {} {} {}", this.actor, this.fence.epoch, now_ms());
                    if let Some(h) = &this.host {
                        h.fenced(&this.actor, &this.fence);
                    }
                    ctx.stop();
                    Err(CartError::Moved)
                }
                Err(e) => Err(CartError::Unavailable(e.to_string())),
            }),
        ))
    }
}

impl Handler<rollcall::reminders::Deactivate> for Cart {
    type Result = ();

    /// The shard goes (a graceful handoff): every message before this one
    /// was handled, and, `Add` being atomic, each of their writes landed or
    /// failed before this one ran, so there is nothing to flush; the release
    /// waits for this answer.
    fn handle(&mut self, _: rollcall::reminders::Deactivate, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Count> for Cart {
    type Result = u64;

    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> u64 {
        self.state.read(|s| s.count)
    }
}

/// What every HTTP worker shares.
#[derive(Clone)]
struct Front {
    host: ActorHost<Cart>,
    reminders: Reminders,
    me: std::net::SocketAddr,
}

fn now_ms() -> u64 {
    rollcall::Timestamp::now().as_millis()
}

async fn add(req: HttpRequest, path: web::Path<(String, u64)>, front: web::Data<Front>) -> HttpResponse {
    let (id, request) = path.into_inner();
    let Ok(actor) = ActorId::new("cart", &id) else {
        return HttpResponse::BadRequest().body("bad cart id");
    };
    match front.host.send(&actor, Add(request)).await {
        Ok(Ok(n)) => HttpResponse::Ok().body(n.to_string()),
        Ok(Err(CartError::Unavailable(e))) => HttpResponse::ServiceUnavailable().body(e),
        Ok(Err(CartError::Moved))
        | Err(HostError::NotHere(_) | HostError::Stopped(_) | HostError::Lapsed(_)) => {
            forward(&req, &actor, &front).await
        }
    }
}

async fn count(req: HttpRequest, id: web::Path<String>, front: web::Data<Front>) -> HttpResponse {
    let Ok(actor) = ActorId::new("cart", id.as_str()) else {
        return HttpResponse::BadRequest().body("bad cart id");
    };
    match front.host.send(&actor, Count).await {
        Ok(n) => HttpResponse::Ok().body(n.to_string()),
        Err(_) => forward(&req, &actor, &front).await,
    }
}

/// Sends the request on to the owner of `actor` once; 503 when there is none
/// (or it is this silo, or the request was forwarded already).
async fn forward(req: &HttpRequest, actor: &ActorId, front: &Front) -> HttpResponse {
    if req.headers().contains_key(FORWARDED) {
        return HttpResponse::ServiceUnavailable().body("moved again: retry");
    }
    let owner = match front.reminders.owner(actor).await {
        Ok(Some(o)) => o,
        Ok(None) => return HttpResponse::ServiceUnavailable().body("no owner yet: retry"),
        Err(e) => return HttpResponse::ServiceUnavailable().body(e.to_string()),
    };
    let Some(to) = owner.endpoint.filter(|e| *e != front.me) else {
        return HttpResponse::ServiceUnavailable().body("owner has no other endpoint: retry");
    };
    let url = format!("http://{to}{}", req.uri());
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    match client
        .request(req.method().clone(), url)
        .insert_header((FORWARDED, "1"))
        .send()
        .await
    {
        Ok(mut r) => {
            let body = r.body().await.unwrap_or_default();
            HttpResponse::build(r.status()).body(body)
        }
        Err(e) => HttpResponse::ServiceUnavailable().body(format!("forwarding to {to}: {e}")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, cluster, silo_addr, http_addr] = &args[..] else {
        eprintln!("usage: carts STORE_URL CLUSTER SILO_ADDR HTTP_ADDR");
        std::process::exit(2);
    };
    let (silo_addr, http): (std::net::SocketAddr, std::net::SocketAddr) =
        (silo_addr.parse()?, http_addr.parse()?);
    // Listening before the silo advertises the port in its membership row:
    // a peer forwards here as soon as it reads the row, and a connection
    // made before the server runs waits in the backlog instead of being
    // refused.
    let listener = std::net::TcpListener::bind(http)?;
    let system = actix::System::new();
    let (silo, reminders, front) = system.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let store = rollcall::connect_retrying(url, Duration::from_secs(30)).await?;
        let silo = Silo::builder(store.clone(), cluster.as_str())
            .listen(silo_addr)
            .options(rollcall::ClusterMembershipOptions::fast())
            .proxy_port(http.port())
            .start()
            .await?;
        let reminders = Reminders::builder(&silo, store.clone())
            .service_id(cluster.as_str())
            .start()
            .await?;
        let states = StateStorage::new(store.state_table(cluster)?);
        let host = host(&reminders, states);
        let front = Front {
            host,
            reminders: reminders.clone(),
            me: http,
        };
        let (leaving, r) = (silo.clone(), reminders.clone());
        actix::spawn(async move {
            term.recv().await;
            if let Err(e) = leaving.shutdown().await {
                eprintln!("carts: graceful shutdown: {e}");
            }
            drop(r);
            actix::System::current().stop();
        });
        Ok::<_, Box<dyn std::error::Error>>((silo, reminders, front))
    })?;
    let data = web::Data::new(front);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/cart/{id}/add/{request}", web::post().to(add))
            .route("/cart/{id}", web::get().to(count))
    })
    .workers(2)
    .disable_signals()
    .listen(listener)?
    .run();
    system.block_on(async {
        actix::spawn(server);
    });
    println!("ready {}", silo.address());
    // 0 after a graceful leave; 70 (`EX_SOFTWARE`) when the silo read
    // itself Dead and stopped the system (`OnDeclaredDead`'s default): a
    // supervisor tells the two apart.
    let code = system.run_with_code()?;
    drop((silo, reminders));
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// The cart host: activations fenced by the shard lease, events printed.
fn host(reminders: &Reminders, states: StateStorage) -> ActorHost<Cart> {
    let slot: std::sync::Arc<std::sync::OnceLock<ActorHost<Cart>>> = Default::default();
    let for_carts = slot.clone();
    let host = ActorHost::with_events(
        reminders,
        move |actor: ActorId, fence: Fence| {
            let key = StateKey::new(actor.to_string(), "cart").expect("a cart id is a valid key");
            Cart {
                state: PersistentState::new(states.fenced(fence.clone()), key),
                fence,
                actor,
                host: for_carts.get().cloned(),
            }
        },
        Some(Box::new(|e| match e {
            HostEvent::Activated { actor, fence } => {
                println!("activated {actor} {} {}", fence.epoch, now_ms())
            }
            HostEvent::Deactivated { actor, fence, why } => {
                println!("deactivated {actor} {} {} {why:?}", fence.epoch, now_ms())
            }
        })),
    );
    let _ = slot.set(host.clone());
    host
}
