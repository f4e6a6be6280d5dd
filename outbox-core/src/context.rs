//! What a handler is given besides its message: the [`Context`], with the [`Delivery`]'s facts
//! (id, attempt, headers), the worker's named destinations and the application's shared
//! [`Resources`].

use std::any::{type_name, Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::destination::{Delivery, DestinationRef, Destinations, Envelope, Exchanges};
use crate::error::ProcessError;
use crate::headers::Headers;
use crate::message_id::MessageId;
use crate::store::{SettleTarget, TransactionalSettlement};

/// Shared resources handlers need, such as a pool, a client or configuration, built once by
/// the application when it starts the worker and keyed by type: one of each type.
/// Destinations (webhook endpoints, brokers), of which an application often has several of one
/// type, are named instead: see [`Context::destination`].
#[derive(Clone, Default)]
pub struct Resources {
    by_type: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    names: Vec<&'static str>,
}

impl Resources {
    /// No resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `resource`, replacing any earlier one of the same type.
    pub fn insert<T: Send + Sync + 'static>(&mut self, resource: T) -> &mut Self {
        if self
            .by_type
            .insert(TypeId::of::<T>(), Arc::new(resource))
            .is_none()
        {
            self.names.push(type_name::<T>());
        }
        self
    }

    /// Whether a resource of type `T` was added.
    pub fn contains<T: Send + Sync + 'static>(&self) -> bool {
        self.by_type.contains_key(&TypeId::of::<T>())
    }

    /// Adds `resource` and returns `self`, for building in one expression.
    pub fn with<T: Send + Sync + 'static>(mut self, resource: T) -> Self {
        self.insert(resource);
        self
    }

    /// The resource of type `T`, if one was added.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.by_type
            .get(&TypeId::of::<T>())
            .and_then(|resource| resource.downcast_ref::<T>())
    }
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Resources may hold secrets (endpoint keys), so only their types are shown.
        f.debug_set().entries(&self.names).finish()
    }
}

/// How a worker settles the message of a context inside a transaction (see
/// [`Context::settle_within`]).
pub(crate) trait SettleWithin {
    /// The message's claim as it stands now, or why the worker no longer holds it.
    fn target(&self) -> Result<SettleTarget<'_>, ProcessError>;

    /// The store's transactional settlement.
    fn settlements(&self) -> &Settlements;
}

/// A store's [`TransactionalSettlement`], kept under its connection type so that a handler
/// that names that type gets it typed.
pub(crate) struct Settlements {
    by_connection: Resources,
    connection_type: &'static str,
}

/// The settlement of a store whose connection is a `C`.
type SettlementOn<C> = Arc<dyn TransactionalSettlement<Connection = C>>;

impl Settlements {
    pub(crate) fn of<S: TransactionalSettlement>(store: Arc<S>) -> Self {
        let settlement: SettlementOn<S::Connection> = store;
        Settlements {
            by_connection: Resources::new().with(settlement),
            connection_type: type_name::<S::Connection>(),
        }
    }

    /// The settlement on `C` connections, or an error naming the store's connection type.
    fn on<C: 'static>(&self) -> Result<&SettlementOn<C>, ProcessError> {
        self.by_connection.get::<SettlementOn<C>>().ok_or_else(|| {
            if self.connection_type == type_name::<std::convert::Infallible>() {
                return ProcessError::permanent(
                    "this worker's store has no transactions, so it cannot settle a message \
                     inside one; exactly-once handlers need a store with a transactional \
                     settlement, such as outbox-diesel's DieselStore",
                );
            }
            ProcessError::permanent(format!(
                "the handler asks for a `{}` connection, but the worker's store lends `{}`; \
                 name the connection type of the pool given to the store",
                type_name::<C>(),
                self.connection_type
            ))
        })
    }
}

/// What a handler receives besides its message: facts about the delivery, the worker's named
/// destinations and the application's shared [`Resources`].
pub struct Context<'a> {
    delivery: &'a Delivery,
    resources: &'a Resources,
    destinations: Option<&'a Destinations>,
    exchanges: Option<&'a Exchanges>,
    settle: Option<&'a dyn SettleWithin>,
    settled_within: bool,
}

impl<'a> Context<'a> {
    /// A context for one delivery, without destinations. The worker builds these; tests of
    /// handlers can too.
    pub fn new(delivery: &'a Delivery, resources: &'a Resources) -> Self {
        Context {
            delivery,
            resources,
            destinations: None,
            exchanges: None,
            settle: None,
            settled_within: false,
        }
    }

    /// A context with the worker's destinations, whose message the worker can settle inside a
    /// transaction; the exchanges with destinations go to `exchanges`, for the delivery log.
    pub(crate) fn in_worker(
        delivery: &'a Delivery,
        resources: &'a Resources,
        destinations: &'a Destinations,
        exchanges: &'a Exchanges,
        settle: &'a dyn SettleWithin,
    ) -> Self {
        Context {
            destinations: Some(destinations),
            exchanges: Some(exchanges),
            settle: Some(settle),
            ..Context::new(delivery, resources)
        }
    }

    /// Runs `work` in one database transaction that also settles this message as done: both
    /// commit or neither does, so the work's effect happens exactly once even across crashes.
    /// `work` gets the store's connection, a `C`: the connection type of the store's pool (a
    /// handler that names another type fails permanently, with an error naming both). Handlers
    /// call it through `outbox_diesel::exactly_once`.
    ///
    /// If the worker no longer holds the message when the transaction ends (its lease passed
    /// to another claim), the work rolls back and this is a retryable error: the claim that
    /// holds it now does the work. Once it has committed, the attempt counts as succeeded
    /// whatever the handler returns after.
    pub fn settle_within<C: 'static>(
        &mut self,
        work: &mut dyn FnMut(&mut C) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessError> {
        let settle = self.settle.ok_or_else(|| {
            ProcessError::permanent(
                "this context was not made by a worker, so there is no claimed message to \
                 settle in a transaction",
            )
        })?;
        if self.settled_within {
            return Err(ProcessError::permanent(
                "this message was settled in a transaction already; a handler settles it once",
            ));
        }
        let settlement = settle.settlements().on::<C>()?;
        settlement.settle_within(&settle.target()?, work)?;
        self.settled_within = true;
        Ok(())
    }

    /// Whether the handler settled its message in a transaction.
    pub(crate) fn was_settled_within(&self) -> bool {
        self.settled_within
    }

    /// The message's stable id, the same on every attempt.
    pub fn message_id(&self) -> MessageId {
        self.delivery.message_id
    }

    /// The message's type string.
    pub fn message_type(&self) -> &str {
        &self.delivery.message_type
    }

    /// Which attempt this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.delivery.attempt
    }

    /// The headers set when the message was enqueued: webhook deliveries send them along.
    pub fn headers(&self) -> &'a Headers {
        &self.delivery.headers
    }

    /// The ordering key the message was enqueued with, if any.
    pub fn ordering_key(&self) -> Option<&'a str> {
        self.delivery.ordering_key.as_deref()
    }

    /// The worker's destination named `name` (given to
    /// [`WorkerBuilder::destination`](crate::WorkerBuilder::destination)), to deliver this
    /// message to, or a permanent failure naming the missing destination (a configuration
    /// mistake that retrying will not fix).
    pub fn destination(&self, name: &str) -> Result<DestinationRef<'a>, ProcessError> {
        let registered = self.destinations.and_then(|d| d.get(name)).ok_or_else(|| {
            let known: Vec<&str> = self
                .destinations
                .map(|d| d.names().collect())
                .unwrap_or_default();
            ProcessError::permanent(format!(
                "this worker has no destination named `{name}` (it has {known:?}); add it with \
                 `WorkerBuilder::destination(\"{name}\", ..)`"
            ))
        })?;
        Ok(DestinationRef {
            registered,
            delivery: self.delivery,
            exchanges: self.exchanges,
        })
    }

    /// An envelope for this message with `body` as JSON, to [`send`](DestinationRef::send)
    /// with other settings (a subject, another content type).
    pub fn envelope(&self, body: Vec<u8>) -> Envelope {
        self.delivery.envelope(body)
    }

    /// The shared resource of type `T`, or a permanent failure naming the missing type (a
    /// configuration mistake that retrying will not fix).
    pub fn resource<T: Send + Sync + 'static>(&self) -> Result<&'a T, ProcessError> {
        self.resources.get::<T>().ok_or_else(|| {
            ProcessError::permanent(format!(
                "no resource of type `{}` was given to the worker; add it with `Resources::insert` \
                 when building the worker",
                type_name::<T>()
            ))
        })
    }
}

impl fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("delivery", self.delivery)
            .field("resources", self.resources)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::priority::Priority;

    struct ApiKey(&'static str);

    #[test]
    fn resources_are_found_by_type_and_missing_ones_name_the_type() {
        let resources = Resources::new().with(ApiKey("secret")).with(42_u32);
        let delivery = Delivery {
            message_id: MessageId::new(),
            message_type: "comment.thankYou".into(),
            attempt: 1,
            headers: Headers::new(),
            ordering_key: None,
            priority: Priority::Normal,
        };
        let ctx = Context::new(&delivery, &resources);
        assert_eq!(ctx.resource::<ApiKey>().unwrap().0, "secret");
        assert_eq!(*ctx.resource::<u32>().unwrap(), 42);
        let missing = ctx.resource::<String>().unwrap_err();
        assert!(missing.reason().contains("alloc::string::String"));
        let shown = format!("{resources:?}");
        assert!(
            !shown.contains("secret"),
            "Debug must not reveal resources: {shown}"
        );
    }

    /// A store whose "connection" is the list of what the work wrote.
    struct Ledger(std::sync::Mutex<Vec<&'static str>>);

    impl TransactionalSettlement for Ledger {
        type Connection = Vec<&'static str>;

        fn settle_within(
            &self,
            _message: &SettleTarget<'_>,
            work: &mut dyn FnMut(&mut Vec<&'static str>) -> Result<(), ProcessError>,
        ) -> Result<(), ProcessError> {
            let mut written = Vec::new();
            work(&mut written)?;
            self.0.lock().unwrap().extend(written);
            Ok(())
        }
    }

    struct Held(Settlements);

    impl SettleWithin for Held {
        fn target(&self) -> Result<SettleTarget<'_>, ProcessError> {
            Ok(SettleTarget {
                token: crate::store::ClaimToken::new(),
                position: 1,
                ordering_key: None,
            })
        }

        fn settlements(&self) -> &Settlements {
            &self.0
        }
    }

    #[test]
    fn a_settlement_runs_on_the_stores_connection_type_and_another_type_is_named() {
        let ledger = Arc::new(Ledger(std::sync::Mutex::new(Vec::new())));
        let held = Held(Settlements::of(Arc::clone(&ledger)));
        let delivery = Delivery {
            message_id: MessageId::new(),
            message_type: "points.award".into(),
            attempt: 1,
            headers: Headers::new(),
            ordering_key: None,
            priority: Priority::Normal,
        };
        let (resources, destinations) = (Resources::new(), Destinations::default());
        let exchanges = Exchanges::default();
        let mut ctx = Context::in_worker(&delivery, &resources, &destinations, &exchanges, &held);

        let wrong = ctx.settle_within(&mut |_: &mut String| Ok(())).unwrap_err();
        assert_eq!(wrong.kind(), crate::FailureKind::Permanent);
        assert!(
            wrong.reason().contains("alloc::string::String")
                && wrong.reason().contains("alloc::vec::Vec<&str>"),
            "{}",
            wrong.reason()
        );
        assert!(!ctx.was_settled_within());

        ctx.settle_within(&mut |written: &mut Vec<&'static str>| {
            written.push("points");
            Ok(())
        })
        .unwrap();
        assert_eq!(*ledger.0.lock().unwrap(), ["points"]);
        assert!(ctx.was_settled_within());
        let twice = ctx
            .settle_within(&mut |written: &mut Vec<&'static str>| {
                written.push("again");
                Ok(())
            })
            .unwrap_err();
        assert!(twice.reason().contains("settled in a transaction already"));
        assert_eq!(*ledger.0.lock().unwrap(), ["points"]);
    }
}
