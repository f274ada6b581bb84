# frozen_string_literal: true

module IdempotentJob
  module Testing
    # Turns the arguments a test names into the positional arguments Sidekiq delivers.
    module Arguments
      # @param job_class [Class] the job class (its #perform's parameters are read)
      # @param args [Array, Hash] positional arguments, or a Hash by parameter name
      # @return [Array] positional arguments
      # @raise [ArgumentError] naming the job and the parameter that is missing,
      #   unknown, or cannot be given by name (keyword or splat parameters)
      def self.positional(job_class, args)
        return args.dup if args.is_a?(Array)
        raise ArgumentError, "#{job_class}: arguments must be an Array or a Hash, got #{args.inspect}" unless
          args.is_a?(Hash)

        by_name(job_class, args.transform_keys(&:to_sym))
      end

      # Arguments by parameter name, in #perform's order: required and optional
      # positional parameters, up to the last one given.
      # @param job_class [Class] the job class (its #perform's parameters are read)
      # @param named [Hash{Symbol => Object}] arguments by parameter name
      # @return [Array] positional arguments
      # @raise [ArgumentError] naming the job and the parameter that is unknown, missing
      #   (required, or optional but followed by one given), or a keyword parameter
      def self.by_name(job_class, named)
        parameters = job_class.instance_method(:perform).parameters
        known = parameters.map(&:last)
        unknown = named.keys - known
        raise ArgumentError, "#{job_class}#perform has no parameter #{unknown.join(", ")}" if unknown.any?

        positional = []
        parameters.each_with_index do |(type, name), index|
          break unless %i[req opt keyreq].include?(type)
          raise ArgumentError, "#{job_class}#perform's keyword #{name} cannot be delivered by Sidekiq" if
            type == :keyreq

          if named.key?(name)
            positional << named[name]
            next
          end
          raise ArgumentError, "#{job_class}#perform needs #{name}; given #{named.keys.join(", ")}" if type == :req

          later = parameters.drop(index + 1).map(&:last) & named.keys
          raise ArgumentError, "#{job_class}#perform: give #{name} too, to give #{later.join(", ")}" if later.any?

          break
        end
        positional
      end
      private_class_method :by_name
    end
  end
end
