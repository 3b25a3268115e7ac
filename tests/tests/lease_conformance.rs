//! The lease-handle conformance suite ([`bagel_tests::conformance::lease`])
//! on every lease backend: the real `bagel-server`, three of them as a
//! `Cluster`, S3 conditional writes on the real S3 server, and
//! `MemoryLeaseBackend` (`tests/src/memory_lease.rs`: the smallest backend
//! that passes, the one a new backend copies, with its module here). Each
//! module names its environment, declares its capabilities and runs every
//! scenario they allow, one test each on a fresh environment.

use bagel_tests::LeaseEnv;
use bagel_tests::conformance::lease::Capabilities;

/// One `#[tokio::test]` per scenario named: `lease::$name` on a fresh
/// environment (`$env`, evaluated in each test) with `$caps`.
macro_rules! scenarios {
    ($env:expr, $caps:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                bagel_tests::conformance::lease::$name(&$env, $caps).await
            }
        )*
    };
}

/// One `bagel-server`: one witness per grant.
mod server {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_witness_per_grant: true,
    };

    scenarios!(LeaseEnv::server().await, CAPS;
        a_held_name_is_refused_with_its_holder_and_deadline_and_nothing_is_taken,
        release_hands_the_watermark_and_the_lease_id_to_the_next_holder,
        an_expired_lease_is_broken_and_its_deadline_becomes_the_watermark,
        a_waiting_acquire_gets_the_name_when_it_is_released,
        fencing_tokens_strictly_increase_per_name,
        a_full_acquire_breaks_a_tentative_lease_and_its_upgrade_fails,
        tentative_then_upgrade_gives_a_full_lease,
        background_renewal_extends_the_deadline_and_the_witness_follows,
        a_renewal_never_shortens_the_lease,
        a_taken_over_lease_reports_loss_and_cannot_renew_or_release,
        metadata_on_renew_and_release_is_kept_in_the_history,
        bad_input_is_refused_naming_the_field,
        unsettled_bags_of_a_broken_lease_travel_down_the_chain,
        a_release_publishes_what_the_writers_wrote,
        witnesses_state_the_grant_and_a_flipped_byte_fails,
    );
}

/// Three `bagel-server`s as one `Cluster`: a lease of names on several
/// servers is held in parts, a witness per part, each of its own part
/// (tests/tests/cluster.rs checks more of them).
mod cluster {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_witness_per_grant: false,
    };

    scenarios!(LeaseEnv::cluster().await, CAPS;
        a_held_name_is_refused_with_its_holder_and_deadline_and_nothing_is_taken,
        release_hands_the_watermark_and_the_lease_id_to_the_next_holder,
        an_expired_lease_is_broken_and_its_deadline_becomes_the_watermark,
        a_waiting_acquire_gets_the_name_when_it_is_released,
        fencing_tokens_strictly_increase_per_name,
        a_full_acquire_breaks_a_tentative_lease_and_its_upgrade_fails,
        tentative_then_upgrade_gives_a_full_lease,
        background_renewal_extends_the_deadline_and_the_witness_follows,
        a_renewal_never_shortens_the_lease,
        a_taken_over_lease_reports_loss_and_cannot_renew_or_release,
        metadata_on_renew_and_release_is_kept_in_the_history,
        bad_input_is_refused_naming_the_field,
        unsettled_bags_of_a_broken_lease_travel_down_the_chain,
        a_release_publishes_what_the_writers_wrote,
        witnesses_state_the_grant_and_a_flipped_byte_fails,
    );
}

/// S3 conditional writes on the real S3 server: one witness per grant; an
/// expired lease is taken over after the clock margin
/// ([`LeaseEnv::takeover_wait`]).
mod s3 {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_witness_per_grant: true,
    };

    scenarios!(LeaseEnv::s3().await, CAPS;
        a_held_name_is_refused_with_its_holder_and_deadline_and_nothing_is_taken,
        release_hands_the_watermark_and_the_lease_id_to_the_next_holder,
        an_expired_lease_is_broken_and_its_deadline_becomes_the_watermark,
        a_waiting_acquire_gets_the_name_when_it_is_released,
        fencing_tokens_strictly_increase_per_name,
        a_full_acquire_breaks_a_tentative_lease_and_its_upgrade_fails,
        tentative_then_upgrade_gives_a_full_lease,
        background_renewal_extends_the_deadline_and_the_witness_follows,
        a_renewal_never_shortens_the_lease,
        a_taken_over_lease_reports_loss_and_cannot_renew_or_release,
        metadata_on_renew_and_release_is_kept_in_the_history,
        bad_input_is_refused_naming_the_field,
        unsettled_bags_of_a_broken_lease_travel_down_the_chain,
        a_release_publishes_what_the_writers_wrote,
        witnesses_state_the_grant_and_a_flipped_byte_fails,
    );
}

/// `MemoryLeaseBackend` on the system clock: one witness per grant. The
/// module to copy for a new backend: its environment
/// (`LeaseEnv::of(Arc::new(backend), takeover_wait)`), its capabilities,
/// every scenario.
mod memory {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_witness_per_grant: true,
    };

    scenarios!(LeaseEnv::memory().await, CAPS;
        a_held_name_is_refused_with_its_holder_and_deadline_and_nothing_is_taken,
        release_hands_the_watermark_and_the_lease_id_to_the_next_holder,
        an_expired_lease_is_broken_and_its_deadline_becomes_the_watermark,
        a_waiting_acquire_gets_the_name_when_it_is_released,
        fencing_tokens_strictly_increase_per_name,
        a_full_acquire_breaks_a_tentative_lease_and_its_upgrade_fails,
        tentative_then_upgrade_gives_a_full_lease,
        background_renewal_extends_the_deadline_and_the_witness_follows,
        a_renewal_never_shortens_the_lease,
        a_taken_over_lease_reports_loss_and_cannot_renew_or_release,
        metadata_on_renew_and_release_is_kept_in_the_history,
        bad_input_is_refused_naming_the_field,
        unsettled_bags_of_a_broken_lease_travel_down_the_chain,
        a_release_publishes_what_the_writers_wrote,
        witnesses_state_the_grant_and_a_flipped_byte_fails,
    );
}
