# frozen_string_literal: true

require "sidekiq/api" # Sidekiq::DeadSet: a Sidekiq 7+ server does not load it itself

module IdempotentJob
  module Sidekiq
    # Keeps a refused delivery Sidekiq itself cannot write back. A job whose arguments
    # hold bytes that are not UTF-8 (a producer in another language wrote them into
    # Redis) is refused by the library, and Sidekiq's retry then fails to write the job
    # to its retry or dead set (its JSON refuses the bytes; Sidekiq 6.4 logs only "ERROR
    # HANDLER THREW AN ERROR") and the job is gone. The door puts a copy in the dead set
    # first, each such String as {ArgsDigest.writable} writes it, with the library's
    # error, so the delivery is dead-lettered as Sidekiq's convention says.
    module Unwritable
      module_function

      # Dead-letters a copy of `job_hash` when Sidekiq cannot write it; does nothing
      # when it can (Sidekiq's own retry keeps it). Writes Sidekiq's dead set. A payload
      # no JSON can carry even so (NaN or Infinity, or a Ruby object: only a payload Ruby
      # built itself, a direct middleware call, holds one) keeps no copy and is logged;
      # the caller raises `error` as before, never the JSON library's error.
      # @param job_hash [Hash] the delivery's job payload
      # @param error [IdempotentJob::Error] why the library refused it
      # @return [Boolean] whether a copy was dead-lettered
      def keep(job_hash, error)
        ::Sidekiq.dump_json(job_hash)
        false
      rescue JSON::GeneratorError, EncodingError
        failure = { "error_class" => error.class.name, "error_message" => error.message,
                    "failed_at" => Time.now.to_f, "retry" => false }
        dead_letter(ArgsDigest.writable(job_hash).merge(failure), error)
      end

      # Puts `copy` in the dead set when Sidekiq's JSON can write it; logs either way.
      # @param copy [Hash] the payload with its Strings made writable and the error's fields
      # @param error [IdempotentJob::Error] why the library refused the delivery
      # @return [Boolean] whether the copy was dead-lettered
      def dead_letter(copy, error)
        ::Sidekiq::DeadSet.new.kill(::Sidekiq.dump_json(copy), notify_failure: false)
        ::Sidekiq.logger.error("#{error.message} (its arguments hold bytes that are not UTF-8, which Sidekiq cannot " \
                               "write back: a copy is in the dead set, each such String as #{ArgsDigest::BYTES})")
        true
      rescue JSON::GeneratorError, EncodingError => e
        ::Sidekiq.logger.error("#{error.message} (no copy is kept: its payload holds what no JSON can carry, " \
                               "#{e.class})")
        false
      end
    end
  end
end
