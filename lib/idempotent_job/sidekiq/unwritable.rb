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
      # when it can (Sidekiq's own retry keeps it). Writes Sidekiq's dead set.
      # @param job_hash [Hash] the delivery's job payload
      # @param error [IdempotentJob::Error] why the library refused it
      # @return [Boolean] whether a copy was dead-lettered
      def keep(job_hash, error)
        ::Sidekiq.dump_json(job_hash)
        false
      rescue JSON::GeneratorError, EncodingError
        failure = { "error_class" => error.class.name, "error_message" => error.message,
                    "failed_at" => Time.now.to_f, "retry" => false }
        copy = ArgsDigest.writable(job_hash).merge(failure)
        ::Sidekiq::DeadSet.new.kill(::Sidekiq.dump_json(copy), notify_failure: false)
        ::Sidekiq.logger.error("#{error.message} (its arguments hold bytes that are not UTF-8, which Sidekiq cannot " \
                               "write back: a copy is in the dead set, each such String as #{ArgsDigest::BYTES})")
        true
      end
    end
  end
end
