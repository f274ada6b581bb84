//! The completion's retries, the delays, the options' checks and the values the
//! bindings rely on (decision names, values crossing threads).

use super::*;

/// Direct, with the first `fail` completions failing as a dead database would, and
/// the pauses between attempts counted instead of waited.
pub(crate) struct Flaky {
    inner: Direct,
    fail: usize,
    pauses: RefCell<Vec<Duration>>,
}

impl Channel for Flaky {
    fn claim(
        &mut self,
        i: &Interrupt<'_>,
        request: &ClaimRequest,
        lock: f64,
    ) -> Result<claim::ClaimReply> {
        self.inner.claim(i, request, lock)
    }

    fn fenced_with_result(
        &mut self,
        i: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&claim::PreparedResult>,
    ) -> Result<()> {
        if change == Fenced::Complete && self.fail > 0 {
            self.fail -= 1;
            return Err(Error::connection("the connection closed"));
        }
        self.inner
            .fenced_with_result(i, change, claim, text, result)
    }

    fn transactional(&self) -> bool {
        false
    }

    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        self.inner.heartbeat_pool()
    }

    fn pause(&mut self, _: &Interrupt<'_>, pause: Duration) -> Result<()> {
        self.pauses.borrow_mut().push(pause);
        Ok(())
    }
}

#[test]
pub(crate) fn a_failing_completion_is_retried_seven_times_then_given_up() {
    let store = store_with(true, 4);
    let protocol = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let i = Interrupt::none();
    let delays: Vec<Duration> = COMPLETION_RETRY_DELAYS
        .iter()
        .map(|s| Duration::from_secs_f64(*s))
        .collect();
    assert_eq!(COMPLETION_RETRY_DELAYS.iter().sum::<f64>(), 15.3);
    // Three failures, then the completion lands.
    let delivery = delivery("digest-a");
    let mut flaky = Flaky {
        inner: direct(&store),
        fail: 3,
        pauses: RefCell::default(),
    };
    let claim = run_claim(begin(&store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let done = protocol
        .complete(
            &mut flaky,
            &i,
            claim,
            None,
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert_eq!((done.recorded, done.attempts), (true, 4));
    assert_eq!(*flaky.pauses.borrow(), delays[..3]);
    assert_eq!(status(&store, &delivery), "completed");
    // Always failing: 7 attempts, then given up; the record stays claimed.
    let delivery = self::delivery("digest-a");
    let mut flaky = Flaky {
        inner: direct(&store),
        fail: usize::MAX,
        pauses: RefCell::default(),
    };
    let claim = run_claim(begin(&store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let done = protocol
        .complete(
            &mut flaky,
            &i,
            claim,
            None,
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert_eq!((done.recorded, done.attempts), (false, 7));
    assert_eq!(*flaky.pauses.borrow(), delays);
    assert_eq!(status(&store, &delivery), "claimed");
    let last = notes.last().unwrap();
    assert_eq!(last.level(), Some(Level::Error));
    assert!(last
        .text(&delivery, protocol.words())
        .unwrap()
        .contains("ran, but its completion could not be recorded after 7 attempts"));
}

#[test]
pub(crate) fn the_deferral_doubles_up_to_the_lease_end_plus_the_margin() {
    assert_eq!(deferral_delay(300.0, 0, 1.0), 1.0);
    assert_eq!(deferral_delay(300.0, 1, 1.0), 2.0);
    assert_eq!(deferral_delay(300.0, 3, 1.0), 8.0);
    assert_eq!(deferral_delay(10.0, 5, 1.0), 11.0);
    assert_eq!(deferral_delay(-3.0, 5, 0.0), 0.0);
    assert_eq!(deferral_delay(1e12, 1000, 1.0), 2f64.powi(30));
}

#[test]
pub(crate) fn a_failed_claim_comes_back_doubling_up_to_a_minute() {
    assert_eq!(unreachable_delay(0), 1.0);
    assert_eq!(unreachable_delay(2), 4.0);
    assert_eq!(unreachable_delay(5), 32.0);
    assert_eq!(unreachable_delay(6), UNREACHABLE_MAX_DELAY);
    assert_eq!(unreachable_delay(u32::MAX), UNREACHABLE_MAX_DELAY);
}

#[test]
pub(crate) fn options_are_checked_naming_the_job() {
    let bad = |options: JobOptions| match Protocol::new("ChargeJob", options, DoorWords::default())
    {
        Err(Error::Config(message)) => message,
        other => panic!("expected a configuration error, got {other:?}"),
    };
    assert!(bad(JobOptions {
        lease_seconds: 0.1,
        ..JobOptions::default()
    })
    .starts_with("ChargeJob: lease must be at least 0.25 s"));
    assert!(bad(JobOptions {
        max_run_seconds: f64::NAN,
        ..JobOptions::default()
    })
    .starts_with("ChargeJob: max_run"));
    assert!(bad(JobOptions {
        lookup: Some(String::new()),
        ..JobOptions::default()
    })
    .contains("lookup"));
    assert_eq!(OnStale::parse("ChargeJob", "hold").unwrap(), OnStale::Hold);
    assert!(
        matches!(OnMismatch::parse("ChargeJob", "yell"), Err(Error::Config(m)) if m.contains("ChargeJob: on_mismatch must be log or raise"))
    );
}

#[test]
pub(crate) fn decision_names_are_the_bindings_names() {
    let names: Vec<&str> = [
        Decision::Ran,
        Decision::Completed,
        Decision::Held,
        Decision::GivenUp,
        Decision::InProgress,
        Decision::Refused,
    ]
    .iter()
    .map(|d| d.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "ran",
            "completed",
            "held",
            "given_up",
            "in_progress",
            "refused"
        ]
    );
    let _: Option<Outcome> = None;
    let _ = NoteKind::Kept;
}

/// A binding keeps protocols per job class and hands claims between threads (Python's
/// pyclasses must be Send; a protocol is shared by every worker thread).
#[test]
pub(crate) fn protocol_values_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Protocol>();
    send_sync::<Claim>();
    send_sync::<Outcome>();
    send_sync::<Direct>();
    send_sync::<Notes>();
}
