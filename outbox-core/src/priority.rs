//! [`Priority`]: which due messages a claim takes first.

/// How soon a due message is claimed, against other due messages: every claim takes the due
/// messages of a higher priority before any of a lower one, and those of one priority in due
/// order. Order within an ordering key comes first: a `High` message waits for the earlier
/// messages of its key, whatever their priority.
///
/// For the few messages someone waits on (a password reset, a sign-in code) ahead of a backlog
/// of the rest (a newsletter, a re-index): claims read the raised priorities apart from the
/// backlog, so a message of a higher priority does not wait for the backlog however long it is;
/// nor, on a destination paced by a rate limit, for the backlog's turns. Raise few: every claim
/// reads the raised ones first, in priority order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Most messages: due order among themselves.
    #[default]
    Normal,
    /// Claimed before every due `Normal` message.
    High,
    /// Claimed before every due `High` and `Normal` message.
    Urgent,
}

impl Priority {
    /// `"normal"`, `"high"` or `"urgent"`, as listings print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Urgent => "urgent",
        }
    }
}
