# frozen_string_literal: true

module IdempotentJob
  # Turns an `idempotency_key` declaration into the operation key of a delivery.
  #
  # A declaration is one of:
  # * a Symbol or String naming a positional `perform` parameter (`:order_id`);
  # * an Integer argument index (`0`);
  # * a dotted String path into a Hash (or Array) argument (`"payload.order.id"`),
  #   whose first segment is a parameter name or an index;
  # * an Array of those, for a composite key.
  #
  # The operation key is a String: a single String/Integer value is stored as is
  # (`42` and `"42"` are the same operation; a String starting with `[`, `{` or `"` as
  # a JSON string, so it never equals a Hash or Array key); a Hash or Array value, and
  # a composite key, as canonical JSON (Hash keys as strings, sorted; integral Floats
  # as Integers), so Hash key order and Symbol/String keys do not change the key and
  # composite parts cannot run together (`["a:b","c"]` and `["a","b:c"]` stay different).
  #
  # These rules, the walk of a dotted path (a Hash by String key, else by the Symbol; an
  # Array by a decimal index), the key's text and the messages refusing a path or a value
  # are the core's (crates/core/src/declaration.rs and keys.rs: `Native.key_declaration`,
  # `Native.declared_key`), the same for the Python package: an Integer of any width as
  # its decimal text, Strings by their bytes (which must be UTF-8), Integer Hash keys as
  # their decimal text; a Time, NaN or a BigDecimal refused. Nothing is written here.
  class Key
    PARAMETER_KINDS = %i[req opt].freeze
    KEYWORD_KINDS = %i[key keyreq].freeze
    private_constant :PARAMETER_KINDS, :KEYWORD_KINDS

    # Longest job type plus operation key, in bytes (the record's index limit; the core's
    # `keys::MAX_KEY_BYTES`).
    MAX_BYTES = Native::MAX_KEY_BYTES

    @cache = {}
    @cache_lock = Mutex.new

    class << self
      # Checks a finished operation key by the core's rules (crates/core/src/keys.rs):
      # valid UTF-8, job type plus key at most {MAX_BYTES} bytes, no NUL character
      # (PostgreSQL text cannot hold one). Keys are compared byte for byte: nothing is
      # normalised (no Unicode NFC, no stripping of spaces).
      # @param job_type [String] the job type (scope)
      # @param operation_key [String] the operation key
      # @param job_name [String] the job, for the message
      # @param declaration [Object] the key declaration, for the error's attribute
      # @return [String] the operation key
      # @raise [OperationKeyError] naming the job and the problem (its job_type, job_class
      #   and declaration set)
      def check!(job_type, operation_key, job_name:, declaration: nil)
        problem = Native.operation_key_problem(job_type, operation_key)
        return operation_key unless problem

        refuse!(job_name, problem, declaration, job_type:)
      end

      # Raises the error of an operation key the core refuses, worded by the core
      # (`Native.key_refusal`: "<job>: <problem>; the job was not run and nothing was
      # recorded").
      # @param job_name [String] the job (its class name), the error's job_class
      # @param problem [String] the core's words for what is wrong with the key
      # @param declaration [Object, nil] the key declaration, for the error's attribute
      # @param job_type [String, nil] the record's job type, for the error's attribute
      # @raise [OperationKeyError] always, naming the job and the problem
      def refuse!(job_name, problem, declaration = nil, job_type: nil)
        message = Native.key_refusal(job_name.to_s, problem)
        raise OperationKeyError.new(message, job_type:, job_class: job_name, declaration:)
      end

      # The text of an operation key as stored, for the calls that read or settle one
      # record ({IdempotentJob.record}, {IdempotentJob.resolve}): checked only for what
      # no record can hold (text that is not valid UTF-8).
      # @param job_type [String] the job type, for the message
      # @param operation_key [String, Integer] the operation key as stored ("42" for 42)
      # @return [String]
      # @raise [OperationKeyError] naming the job type and the problem
      def stored_text(job_type, operation_key)
        key = operation_key.to_s
        problem = Native.key_text_problem(key)
        return key unless problem

        raise OperationKeyError.new("#{job_type}: #{problem}", job_type: job_type.to_s, job_class: job_type.to_s)
      end

      # The operation key of a value given directly (the plain API): a String,
      # Symbol or Integer as is, a Hash or Array as canonical JSON — the rules of a
      # declared key's value.
      # @param value [String, Symbol, Integer, Hash, Array]
      # @param job_name [String] the job type, for messages
      # @return [String]
      # @raise [OperationKeyError] for nil, an empty value or an unsupported type
      def value_key(value, job_name)
        new(job_name, 0, direct: true).operation_key([value])
      end

      # A resolved declaration for a job class, cached per class and declaration.
      # @param job_class [Class] the job class (its `perform` names parameters)
      # @param declaration [Symbol, String, Integer, Array] the idempotency_key option
      # @return [Key]
      # @raise [OperationKeyError] when the declaration is malformed or names an unknown parameter
      def for(job_class, declaration)
        cache_key = [job_class, declaration]
        @cache_lock.synchronize { @cache[cache_key] } ||
          new(job_class, declaration).tap { |key| @cache_lock.synchronize { @cache[cache_key] = key } }
      end
    end

    # @return [Object] the declaration as given
    attr_reader :declaration

    # @param job_class [Class, String] the job class
    # @param declaration [Symbol, String, Integer, Array] see {Key}
    # @param direct [Boolean] the key is given as a value (the plain API), not declared
    # @raise [OperationKeyError] when the declaration is malformed or names an unknown parameter
    # @param shape_only [Boolean] check the declaration's shape only, not the parameter
    #   names (the class is being declared: `perform` may not be defined yet)
    def initialize(job_class, declaration, direct: false, shape_only: false)
      @job_class = job_class
      @direct = direct
      @shape_only = shape_only
      @declaration = declaration
      @composite = declaration.is_a?(Array)
      @paths = parse(@composite ? declaration : [declaration])
      @parts = @paths.map { |path| [path[:index], path[:segments]].freeze }.freeze unless shape_only
    end

    # The operation key of one delivery: the core walks each part's path over the
    # arguments and makes the key's text (crates/core/src/declaration.rs, `resolve`;
    # `Native.declared_key`: one call into the extension), or says which part yields no
    # key and why.
    # @param args [Array] the job's arguments (`job["args"]`)
    # @param job_type [String, nil] the record's job type (the job's scope), for the
    #   error's job_type
    # @return [String] the canonical operation key
    # @raise [OperationKeyError] when an argument is missing, a path reaches nothing, or
    #   the value is nil, empty or of an unsupported type
    def operation_key(args, job_type: nil)
      fail_value(nil, "the job's arguments are #{args.class}, not an Array", job_type) unless args.is_a?(Array)
      text, part, problem = Native.declared_key(@parts, args, @composite)
      text || fail_value(@paths[part], problem, job_type)
    end

    private

    def job_name
      @job_class.is_a?(Class) ? @job_class.name : @job_class.to_s
    end

    def fail_declaration(problem)
      raise OperationKeyError.new(
        "#{job_name}: idempotency key #{@declaration.inspect} #{problem}",
        job_class: job_name, declaration: @declaration
      )
    end

    def fail_value(path, problem, job_type)
      where = path ? " (#{path[:label]})" : ""
      subject = @direct ? "operation key" : "idempotency key #{@declaration.inspect}#{where}"
      job_type ||= job_name if @direct
      self.class.refuse!(job_name, "#{subject}: #{problem}", @direct ? nil : @declaration, job_type:)
    end

    # The parts → [{ label:, index:, segments: [String…] }]: the shape (indexes, names,
    # dotted paths, composites) is the core's parse (crates/core/src/declaration.rs,
    # `Native.key_declaration`); only a name is mapped to a position here.
    def parse(parts)
      paths, problem = Native.key_declaration(parts)
      fail_declaration(problem) if problem
      paths.map do |label, index, name, segments|
        index = parameter_index(name) if name && !@shape_only
        { label:, index:, segments: }
      end
    end

    def parameter_index(name)
      params = perform_parameters
      return fail_declaration("names parameter #{name.inspect}, but #{job_name} is not a loaded class") if params.nil?

      found = params.index { |(_, param)| param.to_s == name }
      if found.nil?
        fail_declaration("names parameter #{name.inspect}, which #{job_name}#perform does not have " \
                         "(it has #{params.map { |(_, p)| p.inspect }.join(", ")})")
      end
      kind = params[found][0]
      unless PARAMETER_KINDS.include?(kind) && params[0...found].all? { |(k, _)| PARAMETER_KINDS.include?(k) }
        keyword_parameter(name, params) if KEYWORD_KINDS.include?(kind)
        fail_declaration("names parameter #{name.inspect}, which is not a plain positional parameter " \
                         "of #{job_name}#perform: use an argument index instead")
      end
      found
    end

    # A keyword parameter after plain positional ones: its value is the keywords Hash's
    # entry, the argument after the positional ones (how ActiveJob serializes keywords).
    def keyword_parameter(name, params)
      positional = params.take_while { |(k, _)| PARAMETER_KINDS.include?(k) }.size
      return unless params.drop(positional).all? { |(k, _)| KEYWORD_KINDS.include?(k) || k == :block }

      fail_declaration("names keyword parameter #{name.inspect} of #{job_name}#perform: keyword arguments " \
                       "arrive as one Hash after the #{positional} positional one(s), so declare the path " \
                       "#{"#{positional}.#{name}".inspect}")
    end

    def perform_parameters
      return nil unless @job_class.is_a?(Class) && @job_class.method_defined?(:perform)

      @job_class.instance_method(:perform).parameters
    end
  end
end
