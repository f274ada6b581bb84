# frozen_string_literal: true

module IdempotentJob
  module ActiveJobDoor
    # What an ActiveJob job's operation key is computed from: `perform`'s deserialized
    # arguments (never the job_id, enqueued_at or the serialized envelope), with every
    # GlobalID-able object — an ActiveRecord model, anything including
    # GlobalID::Identification — replaced by its GlobalID URI
    # (`"gid://app/Order/7"`), inside Hashes and Arrays too. {IdempotentJob::Key} then
    # applies the job's declaration (name, index, dotted path, composite) as on Sidekiq.
    module Arguments
      class << self
        # @param arguments [Array] the job's `arguments` after deserialization
        # @return [Array] the same shape with GlobalID-able objects as their GlobalID
        #   Strings; Hash keys and other values unchanged
        # @raise [URI::GID::MissingModelIdError] (from GlobalID) for an unsaved model
        def keyable(arguments)
          arguments.map { |value| keyable_value(value) }
        end

        private

        def keyable_value(value)
          case value
          when Array then value.map { |v| keyable_value(v) }
          when Hash then value.transform_values { |v| keyable_value(v) }
          else value.respond_to?(:to_global_id) ? value.to_global_id.to_s : value
          end
        end
      end
    end
  end
end
