//! The bag conformance suite ([`bagel_tests::conformance::bags`]) on every
//! bag store: a temp directory, the real S3 server, and the real NFS server
//! over NFSv3 and NFSv4.2 (userspace client). Each module names its store
//! (a [`Backend`], which implements `BagEnv`), declares its capabilities
//! and runs every scenario, one test each on a fresh store.

use bagel_tests::Backend;
use bagel_tests::conformance::bags::Capabilities;

/// One `#[tokio::test]` per scenario named: `bags::$name` on a fresh store
/// (`$env`, evaluated in each test) with `$caps`.
macro_rules! scenarios {
    ($env:expr, $caps:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                bagel_tests::conformance::bags::$name(&$env, $caps).await
            }
        )*
    };
}

/// A temp directory: a bag is one file of records.
mod posix {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_object_per_batch: false,
    };

    scenarios!(Backend::posix(), CAPS;
        writes_are_read_back_in_order,
        late_write_after_close_is_rejected_and_invisible,
        late_write_before_any_close_is_committed,
        metronome_closes_bags_on_time_and_seals_empty_minutes_with_one_object,
        sealer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_sealers_agree,
        summaries_read_the_same_messages_as_bags_byte_for_byte,
        attested_summaries_read_the_same_messages_as_bags,
        retention_removes_only_bags_a_checked_summary_holds,
        expired_lease_messages_are_rejected_by_the_reader,
        closer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_closers_agree,
        a_corrupt_record_is_reported_and_never_misread,
        close_through_closes_everything_up_to_a_deadline,
        readers_of_a_past_range_agree_even_on_bags_nobody_made,
        two_writers_given_one_id_lose_nothing,
    );
}

/// A fresh prefix on the real S3 server: each batch an object of its own.
mod s3 {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_object_per_batch: true,
    };

    scenarios!(Backend::s3(), CAPS;
        writes_are_read_back_in_order,
        late_write_after_close_is_rejected_and_invisible,
        late_write_before_any_close_is_committed,
        metronome_closes_bags_on_time_and_seals_empty_minutes_with_one_object,
        sealer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_sealers_agree,
        summaries_read_the_same_messages_as_bags_byte_for_byte,
        attested_summaries_read_the_same_messages_as_bags,
        retention_removes_only_bags_a_checked_summary_holds,
        expired_lease_messages_are_rejected_by_the_reader,
        closer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_closers_agree,
        a_corrupt_record_is_reported_and_never_misread,
        close_through_closes_everything_up_to_a_deadline,
        readers_of_a_past_range_agree_even_on_bags_nobody_made,
        two_writers_given_one_id_lose_nothing,
    );
}

/// A fresh directory on the real NFS server over NFSv3: a bag is one file.
mod nfs_v3 {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_object_per_batch: false,
    };

    scenarios!(Backend::nfs(3), CAPS;
        writes_are_read_back_in_order,
        late_write_after_close_is_rejected_and_invisible,
        late_write_before_any_close_is_committed,
        metronome_closes_bags_on_time_and_seals_empty_minutes_with_one_object,
        sealer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_sealers_agree,
        summaries_read_the_same_messages_as_bags_byte_for_byte,
        attested_summaries_read_the_same_messages_as_bags,
        retention_removes_only_bags_a_checked_summary_holds,
        expired_lease_messages_are_rejected_by_the_reader,
        closer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_closers_agree,
        a_corrupt_record_is_reported_and_never_misread,
        close_through_closes_everything_up_to_a_deadline,
        readers_of_a_past_range_agree_even_on_bags_nobody_made,
        two_writers_given_one_id_lose_nothing,
    );
}

/// A fresh directory on the real NFS server over NFSv4.2: a bag is one
/// file.
mod nfs_v4 {
    use super::*;

    const CAPS: Capabilities = Capabilities {
        one_object_per_batch: false,
    };

    scenarios!(Backend::nfs(4), CAPS;
        writes_are_read_back_in_order,
        late_write_after_close_is_rejected_and_invisible,
        late_write_before_any_close_is_committed,
        metronome_closes_bags_on_time_and_seals_empty_minutes_with_one_object,
        sealer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_sealers_agree,
        summaries_read_the_same_messages_as_bags_byte_for_byte,
        attested_summaries_read_the_same_messages_as_bags,
        retention_removes_only_bags_a_checked_summary_holds,
        expired_lease_messages_are_rejected_by_the_reader,
        closer_killed_between_any_two_steps_is_finished_by_another,
        concurrent_closers_agree,
        a_corrupt_record_is_reported_and_never_misread,
        close_through_closes_everything_up_to_a_deadline,
        readers_of_a_past_range_agree_even_on_bags_nobody_made,
        two_writers_given_one_id_lose_nothing,
    );
}
