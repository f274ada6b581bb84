# frozen_string_literal: true

require "json"
require "time"
require_relative "../native"

module IdempotentJob
  module Repeats
    # Classifies each repeat of an operation from the facts recorded with it — a pure
    # function: no database, no clock. The rules live in the core crate
    # (crates/core/src/repeats/, whose module doc documents each fact and cause); this module
    # hands them a delivery's facts and builds the {Repeat} Structs. A delivery's facts
    # (a Hash with String keys, as the doors record them) are:
    # * "at" (Float, epoch seconds by the database clock): when it reached the claim;
    # * "jid" (String): its delivery id (Sidekiq jid; "job_id" for ActiveJob, "task_id"
    #   for the Celery door, or "delivery_id" / "message_id", are read too);
    # * "retry_count" (Integer, Sidekiq: absent before the queue's first retry),
    #   "executions" (Integer, ActiveJob: 1 on the first run, 2 on the first retry) or
    #   "retries" (Integer, Celery: 0 on the first run, 1 on the first retry);
    # * "receive_count" (Integer, the Python SQS door: SQS's count of receives, not a
    #   retry count; a later receive is read by its previous receive's answer: after
    #   "in_progress" the deferred copy back, after a run a new "claimed" the queue's retry);
    # * "enqueued_at" / "created_at" (Float epoch seconds; Sidekiq 8's integer
    #   milliseconds and ActiveJob's ISO 8601 text are read as such too);
    # * "deferrals" (Integer): how many times the gem deferred this copy already;
    # * "producer" (String): who enqueued it ({IdempotentJob::Producer});
    # * "decision" (String): what the claim statement answered it — "claimed" (a first
    #   claim or a retry's), "takeover" (it took over an expired lease), "in_progress"
    #   (it met a live claim), "completed", "held", "given_up", "refused".
    #
    # Causes ({CAUSES}): :concurrent_copy (it met a live claim), :queue_retry (the same
    # delivery with more retries), :redelivery (the same delivery without a new retry, or
    # a takeover of an expired lease; `restart` names the deploy/restart it follows within
    # the window), :re_enqueue_same_producer / :re_enqueue_other_producer / :re_enqueue
    # (another delivery after the claim ended), :unknown (no facts recorded). A copy the
    # gem deferred that comes back (deferrals above 0, or SQS's next receive after
    # "in_progress") keeps its first arrival's cause, with `deferred_return: true`.
    module Classifier
      # Every cause, in report order (the core's).
      CAUSES = Native.repeat_causes.map(&:first).freeze
      # How each cause reads in a report (the core's labels).
      LABELS = Native.repeat_causes.to_h.freeze

      # One classified repeat.
      # Members: at (Time), id (String), cause (Symbol of {CAUSES}), after_claim (Float
      # seconds since the operation's first claim), after_enqueue (Float seconds since its
      # own enqueue, nil when unknown), retry_count (the queue's retries before this one:
      # Sidekiq's retry_count, ActiveJob's executions - 1), producer, first_producer, live_claim
      # (Boolean: it met a live claim), deferred_return (Boolean), restart (Time of the
      # matching deploy/restart, or nil), decision (String).
      Repeat = Struct.new(:at, :id, :cause, :after_claim, :after_enqueue, :retry_count, :producer, :first_producer,
                          :live_claim, :deferred_return, :restart, :decision, keyword_init: true)

      class << self
        # @param deliveries [Array<Hash{String => Object}>] an operation's deliveries in
        #   arrival order, the first claim's first (facts as described above; Time values
        #   are read as epoch seconds)
        # @param completed_at [Time, nil] when the operation completed (a "completed"
        #   answer to a delivery that arrived earlier means it waited for that commit)
        # @param restarts [Array<Time>] recorded deploy/restart times
        # @param restart_window [Numeric] seconds after a restart within which a redelivery
        #   is matched to it
        # @return [Array<Repeat>] one per delivery after the first
        # @raise [ConfigurationError] for facts JSON cannot carry or a negative window
        def classify(deliveries, completed_at: nil, restarts: [], restart_window: Native::DEFAULT_RESTART_WINDOW)
          facts = JSON.generate(deliveries.map { |d| d.transform_values { |v| v.is_a?(Time) ? v.to_f : v } },
                                max_nesting: Native::MAX_NESTING + 2) # facts in an array
          restart_at = restarts.to_h { |t| [t.to_f, t] } # the core answers a restart by its epoch seconds
          # No number of seconds (true, nil, "90") is refused in the core's words.
          window = Native.restart_window(restart_window)
          Native.classify_repeats(facts, completed_at&.to_f, restart_at.keys, window).map do |r|
            restart = r[:restart] && restart_at.fetch(r[:restart]) { time(r[:restart]) }
            Repeat.new(**r, at: time(r[:at]), restart:)
          end
        rescue JSON::GeneratorError => e
          raise ConfigurationError, "the deliveries' facts cannot be read as JSON: #{e.message}"
        end

        # @param operations [Array<#job_type, #producers>] operations with the producers
        #   that enqueued them (Array of String)
        # @return [Hash{Array(String, String, String) => Integer}] per [job_type, producer
        #   a, producer b] (a < b), how many operations both enqueued; most first (the core
        #   counts: `Native.repeats_report`)
        def producer_pairs(operations)
          ops = operations.map do |op|
            { job_type: op.job_type.to_s, operation_key: "", status: "", producers: op.producers.to_a.compact }
          end
          JSON.parse(Native.repeats_report(JSON.generate(ops))).fetch("producer_pairs")
              .to_h { |type, a, b, count| [[type, a, b], count] }
        end

        # @param value [Numeric, String, Time, nil] epoch seconds, epoch milliseconds
        #   (Sidekiq 8), ISO 8601 text (ActiveJob's enqueued_at, the record's times) or a Time
        # @return [Float, nil] epoch seconds (nil for anything else; the core's rule)
        def seconds(value)
          case value
          when Time then value.to_f
          when Numeric, String then Native.epoch_seconds(JSON.generate(value))
          end
        rescue JSON::GeneratorError
          nil
        end

        private

        def time(seconds) = seconds && Time.at(seconds)
      end
    end
  end
end
