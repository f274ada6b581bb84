# frozen_string_literal: true

require "json"
require "securerandom"

module IdempotentJob
  module Testing
    # An operation run with {IdempotentJob.perform_once}, for the kit to replay:
    #
    #   charge = IdempotentJob::Testing::PlainJob.new("ChargeOrder", key: 0) do |order_id, cents|
    #     Gateway.charge(order_id, cents)
    #   end
    #   expect(charge).to be_idempotent_for(42, 1500).with_effect { Charge.count }
    class PlainJob
      # @return [String] the job type
      attr_reader :job_type
      # @return [Integer] which argument is the operation key
      attr_reader :key
      # @return [Hash] further perform_once options (on_stale:, lookup:, heartbeat:…)
      attr_reader :options
      # @return [Proc] the body, called with the arguments
      attr_reader :body

      # @param job_type [String]
      # @param key [Integer] the argument that is the operation key
      # @param options [Hash] perform_once options other than lease:/payload:/id:/deferrals:
      # @yield the body, given the arguments
      # @raise [ArgumentError] without a body or with a negative key index
      def initialize(job_type, key: 0, **options, &body)
        raise ArgumentError, "PlainJob needs a body block" unless body
        raise ArgumentError, "key: must be an argument index, got #{key.inspect}" unless key.is_a?(Integer) &&
                                                                                         !key.negative?

        @job_type = job_type.to_s
        @key = key
        @options = options
        @body = body
      end

      # @return [String] the job type
      def to_s
        @job_type
      end
      alias inspect to_s
    end
  end
end
