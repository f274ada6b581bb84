# frozen_string_literal: true

require "json"
require "sidekiq"

module Soak
  # The soak's own bookkeeping, in Redis (a process the soak never kills, so nothing a
  # worker wrote before its SIGKILL is lost): a journal of the gem's decisions about
  # each claim, of deliveries that failed, and of bodies that ran without their
  # completion being recorded; and counters of every event. Written by the workers,
  # read by the driver's checker.
  module Journal
    # Redis list of journal entries (JSON).
    ENTRIES = "soak:journal"
    # Redis hash of counters: "<event>" or "<event>:<kind or decision>" → count.
    COUNTS = "soak:counts"
    # Redis key a worker sets once it is fetching jobs: "soak:ready:<worker id>".
    READY_PREFIX = "soak:ready:"
    # Events whose every occurrence is journaled (the others are only counted).
    JOURNALED = %i[claimed completed held given_up released lost_claim mismatch].freeze
    # Entries read per LRANGE.
    PAGE = 10_000

    module_function

    # Journals one entry, stamped with this worker's id and the time.
    # @param kind [String, Symbol] what happened ("failed", "unrecorded_completion"…)
    # @param fields [Hash] the entry's details (reference, attempt, error…)
    # @return [void]
    def write(kind, **fields)
      entry = JSON.generate({ kind:, worker: Soak.worker_id, at: Time.now.to_f, **fields })
      ::Sidekiq.redis { |redis| redis.rpush(ENTRIES, entry) }
    end

    # Adds to a counter.
    # @param name [String] the counter
    # @param by [Integer]
    # @return [void]
    def count(name, by = 1)
      ::Sidekiq.redis { |redis| redis.hincrby(COUNTS, name, by) }
    end

    # The subscriber of the gem's events (IdempotentJob.subscribe) in each worker: counts
    # every event, journals claims and their ends, and notes the event on the delivering
    # thread for {Observer}.
    # @param name [Symbol] the event
    # @param payload [Hash] the event's payload
    # @return [void]
    def observe(name, payload)
      (Thread.current[:soak_events] ||= []) << name
      counter = [name, payload[:kind] || payload[:decision]].compact.join(":")
      entry = if JOURNALED.include?(name)
                JSON.generate({ kind: name, worker: Soak.worker_id, at: Time.now.to_f,
                                reference: Soak.reference(payload[:job_type], payload[:operation_key]),
                                attempt: payload[:attempt], claim: payload[:kind], jid: payload[:jid] }.compact)
              end
      ::Sidekiq.redis do |redis|
        redis.pipelined do |pipeline|
          pipeline.hincrby(COUNTS, counter, 1)
          pipeline.rpush(ENTRIES, entry) if entry
        end
      end
    end

    # @return [Array<Hash>] every entry, oldest first ("kind", "worker", "at" and details)
    def entries
      lines = ::Sidekiq.redis do |redis|
        (0...redis.llen(ENTRIES)).step(PAGE).flat_map { |start| redis.lrange(ENTRIES, start, start + PAGE - 1) }
      end
      lines.map { |line| JSON.parse(line) }
    end

    # @return [Hash{String => Integer}] every counter
    def counts
      ::Sidekiq.redis { |redis| redis.hgetall(COUNTS) }.transform_values(&:to_i)
    end

    # @param worker_id [String]
    # @return [Boolean] whether the worker said it is fetching jobs
    def ready?(worker_id)
      ::Sidekiq.redis { |redis| !redis.get("#{READY_PREFIX}#{worker_id}").nil? }
    end
  end
end
