# frozen_string_literal: true

require "json"
require_relative "native"

module IdempotentJob
  # One delivery of an operation, as a door hands it to the {Protocol}: what is
  # claimed, what is stored with the claim, and the facts of this attempt. Frozen.
  #
  #   IdempotentJob::Delivery.new(job_type: "ChargeOrder", operation_key: "42", payload: [42, 1500],
  #                               id: message_id, facts: { "receive_count" => 2 })
  class Delivery
    # The payload key of a delivery's deferral count, as the Ruby doors write it into the
    # copy they push back (Sidekiq's job hash, ActiveJob's serialized job).
    DEFERRALS = "idempotency_deferrals"
    # The payload key of the producer stamped at enqueue ({Producer::KEY}).
    PRODUCER = "idempotency_producer"
    # The {JobOptions::PREFIX}ed keys the gem itself writes into a queue's payload: taken
    # as they are, never read as a misspelled option.
    CARRIED = [DEFERRALS, PRODUCER].freeze

    # @return [String] the job type (scope) the record is stored under
    attr_reader :job_type
    # @return [String] the operation key, as stored
    attr_reader :operation_key
    # @return [Array] the payload: digested to notice a mismatch, stored by a takeover of a
    #   stale claim for `resolve(as: :rerun)`
    attr_reader :payload
    # @return [String, nil] the job class name a rerun enqueues (stored by a takeover of a
    #   stale claim; every delivery's is listed in the repeats report)
    attr_reader :job_class
    # @return [String, nil] the queue a rerun enqueues on (stored with the job class)
    attr_reader :queue
    # @return [String, nil] this delivery's id (a jid, a job_id, a message id)
    attr_reader :id
    # @return [Integer] how many times this delivery was deferred already (0 for a fresh one)
    attr_reader :deferrals
    # @return [Hash{String => Object}] facts of this attempt as the queue gave them
    #   (retry_count, enqueued_at, created_at…), JSON values only
    attr_reader :facts

    # @param job_type [String, #to_s] the job type (scope)
    # @param operation_key [String] the operation key (see {Key} / {IdempotentJob.perform_once})
    # @param payload [Array, Object] what the delivery carries (default: none); a non-Array is wrapped
    # @param job_class [String, #to_s, nil] the job class name to store
    # @param queue [String, nil] the queue name to store
    # @param id [String, #to_s, nil] the delivery's id
    # @param deferrals [Integer] deferrals so far (drives the core's back-off, `Native.deferral_delay`)
    # @param facts [Hash] attempt facts; keys become Strings
    # @raise [ConfigurationError] for a job type that is not valid UTF-8, or deferrals that
    #   are no count (a payload's own idempotency_deferrals: negative, past
    #   Native::MAX_DEFERRALS, not an Integer or its decimal text: the core's count rule)
    def initialize(job_type:, # rubocop:disable Metrics/ParameterLists -- a value object, keywords only
                   operation_key:, payload: [], job_class: nil, queue: nil, id: nil, deferrals: 0,
                   facts: {})
      @job_type = IdempotentJob.job_type_text(job_type)
      @operation_key = operation_key
      @payload = payload.is_a?(Array) ? payload : [payload]
      @job_class = job_class&.to_s
      @queue = queue&.to_s
      @id = id&.to_s
      @deferrals = deferral_count(deferrals)
      @facts = frozen_with_string_keys?(facts) ? facts : facts.to_h.transform_keys(&:to_s).freeze
      freeze
    end

    # A queue's delivery (a Sidekiq job hash, an ActiveJob job) of a job with these options:
    # its facts are the queue's own with the two the gem carries in every queue's payload,
    # "deferrals" (as the payload holds it) and "producer" ({Producer}, stamped at enqueue);
    # nil facts are left out.
    # @param options [JobOptions] the job's resolved options (the record's job type is their scope)
    # @param deferrals [Integer, Object, nil] the payload's deferral count (nil: none; checked as {#initialize})
    # @param producer [String, nil] the producer the payload carries
    # @param facts [Hash{String => Object}] the queue's facts (a fresh Hash: completed and frozen here)
    # @param fields [Hash] operation_key:, payload:, job_class:, queue:, id: as {#initialize}
    # @return [Delivery]
    # @raise [ConfigurationError] as {#initialize}
    def self.queued(options, deferrals:, producer:, facts:, **fields)
      facts["deferrals"] = deferrals
      facts["producer"] = producer
      facts.compact!
      new(job_type: options.scope, deferrals:, facts: facts.freeze, **fields)
    end

    # @return [String] the facts as a JSON object text (the claim request's `facts_json`),
    #   written by the native extension (`Native.facts_json`: Ruby's JSON is slow for
    #   Float timestamps) by the rules of every value crossing the core (Integers of any
    #   width, nesting at most Native::MAX_NESTING)
    # @raise [ArgsDigest::Unwritable] for a value JSON cannot carry (NaN, a Time, a
    #   String that is not UTF-8), naming it
    def facts_json
      json, problem = Native.facts_json(@facts)
      raise ArgsDigest::Unwritable, "it holds #{problem}" if problem

      json
    end

    private

    # A frozen Hash with String keys is kept as given (a door's own, built per delivery).
    def frozen_with_string_keys?(facts)
      return false unless facts.is_a?(Hash) && facts.frozen?

      facts.each_key { |key| return false unless key.is_a?(String) }
      true
    end

    # The deferrals so far as a count (nil: none), or the job's error: a payload's own
    # `idempotency_deferrals` may hold anything a producer wrote.
    def deferral_count(deferrals)
      return 0 if deferrals.nil?
      # The common case without crossing into Rust (a delivery stays one native call).
      return deferrals if deferrals.is_a?(Integer) && deferrals.between?(0, Native::MAX_DEFERRALS)

      # The core's count rule and words (the Celery and SQS doors' counts alike): an
      # Integer or its decimal text ("010" is 10; " 5", "+5", "1_0" and "0x1f" are no count).
      # A String is sent as UTF-8, a byte it cannot hold replaced (JSON.parse leaves a
      # producer's raw byte in place), so the core refuses it in the count's words.
      text = deferrals.to_s if deferrals.is_a?(Integer)
      text = deferrals.encode(Encoding::UTF_8, invalid: :replace, undef: :replace) if deferrals.is_a?(String)
      Native.delivery_count(@job_type, "the delivery's deferrals (idempotency_deferrals)", text, deferrals.inspect)
    end
  end
end
