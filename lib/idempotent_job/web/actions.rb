# frozen_string_literal: true

module IdempotentJob
  class Web
    # What each route of the page does, whoever hosts it (the standalone app or the
    # Sidekiq Web tab): reads through the public API and {Records}, renders with a
    # {View}, and answers one of
    # * `[:html, status, body]` — a page (200; 400 for bad input, 404, 405, 409 when
    #   the record does not allow the resolve asked for: no longer held or given up, or a
    #   rerun of a record with no stored job);
    # * `[:redirect, location]` — after a resolve, to the record's page;
    # * `[:text, status, content_type, body]` — `/metrics` (200; 503 naming the problem
    #   when the database cannot be read);
    # * `[:csv, filename, body]` — the repeats report as CSV.
    #
    # A database that cannot be read (unreachable, a wrong role or password, no such
    # database, the table missing: {.unavailable?}; or the gem's settings build no store:
    # database_url set nowhere) is a 503 page naming the problem, never
    # an exception into the host app; any other answer of the server (a bug) is raised to it.
    class Actions
      # Rows per list.
      LIMIT = 200
      # Routes: [verb, path under the mount point] → method.
      ROUTES = {
        [:get, ""] => :index,
        [:get, "/records"] => :records,
        [:get, "/record"] => :record,
        [:get, "/confirm"] => :confirm,
        [:post, "/resolve"] => :resolve,
        [:get, "/repeats"] => :repeats,
        [:get, "/repeats.csv"] => :repeats_csv,
        [:get, "/takeovers"] => :takeovers,
        [:get, "/metrics"] => :metrics
      }.freeze
      # The content type of Prometheus' text exposition format.
      METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
      # How a person may settle a held or given-up operation.
      RESOLUTIONS = %w[done rerun].freeze
      # Statuses a resolve applies to.
      SETTLEABLE = %i[held given_up].freeze

      # SQLSTATE 22021: PostgreSQL cannot send a row as UTF-8 (a SQL_ASCII database stores
      # any bytes, and a record may hold some that are not UTF-8).
      UNDECODABLE = "22021"

      # The errors of a database the page cannot read (down, refusing the URL's role or
      # password, no such database, no table, a timeout): a 503, not the host app's 500.
      # A DatabaseError is one only for the SQLSTATEs of {UNAVAILABLE_STATES}
      # ({.unavailable?}); any other answer (a syntax error, an internal error: a bug) is
      # raised to the host app, whose error tracker sees it.
      UNAVAILABLE = [IdempotentJob::ConnectionError, IdempotentJob::TimeoutError, IdempotentJob::LockTimeoutError,
                     IdempotentJob::DatabaseError].freeze

      # The SQLSTATEs of a server answer meaning the database cannot be read: classes 08
      # (connection), 28 (the role or password refused), 53 (out of resources: too many
      # connections, disk full, memory), 57 (operator intervention: a cancel, a shutdown);
      # 3D000 (no such database), 42P01 (no table: the migrations never ran), 42703 (a
      # drifted table), 42501 (the role lacks a privilege on the table), 25006 (a
      # read-only transaction: a standby, during a failover).
      UNAVAILABLE_STATES = /\A(?:08|28|53|57)...\z|\A(?:3D000|42P01|42703|42501|25006)\z/

      # Whether `error` (one of {UNAVAILABLE}) means the database cannot be read (a 503):
      # every ConnectionError, TimeoutError and LockTimeoutError, a DatabaseError only
      # for {UNAVAILABLE_STATES}.
      # @param error [IdempotentJob::Error]
      # @return [Boolean]
      def self.unavailable?(error)
        return true unless error.is_a?(IdempotentJob::DatabaseError)

        UNAVAILABLE_STATES.match?(error.sqlstate.to_s)
      end

      # Bad input from the browser (a missing or malformed parameter): a 400 page.
      class BadRequest < StandardError; end

      # @param limit [Integer] rows per list
      def initialize(limit: LIMIT)
        @limit = limit
      end

      # @param verb [Symbol] :get or :post
      # @param path [String] the path under the mount point, without a trailing "/"
      # @param params [Hash{String => String}] query and form parameters
      # @param view [View] how to render
      # @return [Array] see the class comment
      #   A record the database cannot send as UTF-8 (SQLSTATE 22021), or the core cannot read
      #   (UnreadableRecordError: a time edited to 'infinity'), is a 500 page saying so, not
      #   a 400 (only the browser's bad input is);
      #   a database that cannot be read ({.unavailable?}) a 503 naming the problem (`/metrics`:
      #   a plain-text 503).
      # @raise [IdempotentJob::DatabaseError] any other answer of the server (a bug, for the
      #   host app's error tracker)
      def call(verb, path, params, view)
        @params = params
        @view = view
        check_params!(params)
        name = ROUTES[[verb, path]]
        if name
          unset = settings_problem
          return unavailable(unset, metrics: name == :metrics) if unset

          return send(name)
        end

        verbs = ROUTES.keys.filter_map { |v, p| v.to_s.upcase if p == path }
        return error(405, "#{path} only answers #{verbs.join(", ")}.") if verbs.any?

        error(404, "No page at #{path.inspect}.")
      rescue IdempotentJob::UnreadableRecordError => e
        unreadable(e)
      rescue BadRequest, IdempotentJob::ConfigurationError => e
        error(400, e.message)
      rescue *UNAVAILABLE => e
        unreadable_database(e, metrics: name == :metrics)
      end

      private

      # The page for an error of {UNAVAILABLE}: a 500 for a row PostgreSQL cannot send as
      # UTF-8, a 503 for a database that cannot be read; any other error raised again.
      def unreadable_database(cause, metrics:)
        return undecodable(cause) if cause.is_a?(IdempotentJob::DatabaseError) && cause.sqlstate == UNDECODABLE
        raise cause unless self.class.unavailable?(cause)

        unavailable(cause, metrics:)
      end

      attr_reader :params, :view

      # The gem's own settings that build no store (database_url set nowhere, a setting
      # the core refuses), or nil: the server's problem, answered as a database that cannot
      # be read (503), never as the browser's bad request (400).
      def settings_problem
        IdempotentJob.store
        nil
      rescue IdempotentJob::ConfigurationError => e
        e
      end

      def index
        job_type = param("job_type")
        page("index", "Held and given-up operations", job_type:, job_types: Records.job_types,
                                                      held: Records.held(job_type:, limit: @limit),
                                                      given_up: Records.given_up(job_type:, limit: @limit))
      end

      def records
        job_type = param("job_type")
        key = present("operation_key", optional: true)
        status = param("status")
        found = job_type && Records.search(job_type:, key_prefix: key, status:, limit: @limit)
        page("records", "Records", job_type:, key:, status:, found:, job_types: Records.job_types)
      end

      def record
        found = find_record or return not_found
        resolved = RESOLUTIONS.include?(params["resolved"]) ? params["resolved"] : nil
        page("record", "Record", record: found, resolved:, problem: nil)
      end

      def confirm
        found = find_record or return not_found
        resolution = resolution!
        return conflict(found, "it is #{found.status.to_s.tr("_", " ")}, not held or given up") unless
          SETTLEABLE.include?(found.status)

        page("confirm", "Confirm", record: found, resolution:)
      end

      def resolve
        resolution = resolution!
        found = find_record or return not_found
        problem = stale_form(found)
        return conflict(found, problem) if problem

        IdempotentJob.resolve(found.job_type, found.operation_key, as: resolution.to_sym)
        [:redirect, view.url("/record", job_type: found.job_type, operation_key: found.operation_key,
                                        resolved: resolution)]
      rescue IdempotentJob::ConfigurationError => e
        # The core refuses a rerun of a record with no stored job and leaves it as it was: a
        # resolve the record does not allow (409, with its buttons), not a bad request.
        now = IdempotentJob.record(found.job_type, found.operation_key)
        raise unless now && SETTLEABLE.include?(now.status)

        conflict(now, e.message)
      rescue IdempotentJob::ConnectionError, IdempotentJob::TimeoutError, IdempotentJob::DatabaseError
        # The server's answer, not the record's refusal: a database that cannot be
        # written is the pages' 503, any other answer a bug raised to the host app ({#call}).
        # (A LockTimeoutError, the row locked by a delivery, stays a 409 with the record.)
        raise
      rescue IdempotentJob::Error => e
        conflict(IdempotentJob.record(found.job_type, found.operation_key) || found, e.message)
      end

      def repeats
        hours = number("hours", 24, 1..(24 * 90))
        job_type = param("job_type")
        now = Time.now
        report = Repeats.report(since: now - (hours * 3600), job_type:)
        operations = report.operations
        series = by_cause(operations)
        page("repeats", "Repeats", hours:, job_type:, operations: operations.first(@limit), total: operations.size,
                                   summary: report.summary, pairs: report.producer_pairs,
                                   sql: IdempotentJob.repeats_sql,
                                   chart: Chart.new(series:, from: now - (hours * 3600), to: now).to_svg)
      end

      def repeats_csv
        hours = number("hours", 24, 1..(24 * 90))
        report = Repeats.report(since: Time.now - (hours * 3600), job_type: param("job_type"))
        [:csv, "idempotent_job-repeats-#{Time.now.utc.strftime("%Y%m%dT%H%M%SZ")}.csv", report.to_csv]
      end

      def takeovers
        hours = number("hours", 24, 1..(24 * 90))
        page("takeovers", "Takeovers and stale claims",
             hours:, takeovers: Records.takeovers(since: Time.now - (hours * 3600), limit: @limit),
             stale: Records.stale_claims(limit: @limit))
      end

      # Prometheus' text exposition format, read from the table (every process answers
      # the same): see {Records.metrics}.
      def metrics
        [:text, 200, METRICS_TYPE, Records.metrics]
      end

      # The times of the operations' repeats per cause (its label), deferred copies coming
      # back left out: the chart's series.
      def by_cause(operations)
        repeats = operations.flat_map(&:repeats).reject(&:deferred_return).select(&:at)
        repeats.group_by { |r| Repeats::Classifier::LABELS.fetch(r.cause) }.transform_values { |rs| rs.map(&:at) }
      end

      # Why a resolve form no longer applies, or nil: the record is not held or given up
      # any more, or its claim changed since the form was shown (another person settled
      # it and a later delivery was held again).
      def stale_form(found)
        now = found.status.to_s.tr("_", " ")
        return "it is #{now} now, not held or given up" unless SETTLEABLE.include?(found.status)

        token = param("claim_token")
        return if token.nil? || token == found.claim_token

        "it changed since the confirmation page was shown (claim #{token} is now #{found.claim_token}); review it again"
      end

      def page(name, title, **locals)
        [:html, 200, view.page(name, title:, **locals)]
      end

      def error(status, message)
        [:html, status, view.page("error", title: "Error", status:, message:)]
      end

      def undecodable(cause)
        error(500, "A record holds bytes that are not UTF-8, so PostgreSQL will not send it " \
                   "(#{cause.message.scrub}). The database's encoding is probably SQL_ASCII, which stores any " \
                   "bytes: fix or delete the row in idempotent_job_records (its job_type, operation_key or " \
                   "last_error), or move the table to a UTF8 database.")
      end

      # The 500 of a record the core cannot read: the core's text names the record, the
      # column and the fix.
      def unreadable(cause)
        error(500, "A record cannot be read, so this page cannot be shown: #{cause.message.scrub}")
      end

      # The 503 of a database the page cannot read: `cause`'s class, SQLSTATE and text
      # (which never holds a password), as a page, or as plain text for `/metrics` (a
      # scrape fails visibly: Prometheus sets `up` to 0 and shows the body's first line).
      def unavailable(cause, metrics:)
        state = cause.respond_to?(:sqlstate) && cause.sqlstate ? ", SQLSTATE #{cause.sqlstate}" : ""
        problem = "the idempotency records cannot be read (#{cause.class.name.split("::").last}#{state}): " \
                  "#{cause.message.scrub.delete("\0")}"
        return [:text, 503, "text/plain; charset=utf-8", "idempotent_job /metrics: #{problem}\n"] if metrics

        error(503, "Unavailable: #{problem}")
      end

      def not_found
        error(404, "No record of #{params["job_type"]} operation #{params["operation_key"].inspect}.")
      end

      def conflict(found, problem)
        [:html, 409, view.page("record", title: "Record", record: found, resolved: nil,
                                         problem: "Not resolved: #{problem}.")]
      end

      # The record the request names. Its key is taken exactly as sent, blank or only
      # spaces included (a record can have such a key), so every record can be opened.
      def find_record
        IdempotentJob.record(present("job_type"), present("operation_key", empty: true))
      end

      # Refuses (400) a parameter name or value that is not valid UTF-8 or holds a NUL
      # byte: neither can name anything the page stores (PostgreSQL text holds
      # neither), and either would fail later, deeper, as a 500.
      def check_params!(value, name = nil)
        case value
        when Hash
          value.each do |k, v|
            check_params!(k)
            check_params!(v, k)
          end
        when Array then value.each { |v| check_params!(v, name) }
        when String
          what = name ? "parameter #{printable(name)}" : "a parameter name"
          raise BadRequest, "#{what} is not valid UTF-8" unless
            value.dup.force_encoding(Encoding::UTF_8).valid_encoding?
          raise BadRequest, "#{what} contains a NUL byte" if value.include?("\0")
        end
        nil
      end

      def printable(name)
        name.to_s.dup.force_encoding(Encoding::UTF_8).scrub.delete("\0").inspect
      end

      def resolution!
        value = params["as"].to_s
        raise BadRequest, "as= must be one of #{RESOLUTIONS.join(", ")}, got #{value.inspect}" unless
          RESOLUTIONS.include?(value)

        value
      end

      # A parameter's value, nil when absent or blank (kept as sent otherwise: an
      # operation key may have spaces of its own).
      def param(name)
        value = params[name]
        value.is_a?(String) && !value.strip.empty? ? value : nil
      end

      def required(name)
        param(name) || raise(BadRequest, "#{name} is required")
      end

      # A parameter's value exactly as sent, spaces included (a job type or key may be
      # only spaces). Absent, or empty unless `empty`: nil when `optional`, else a 400.
      def present(name, empty: false, optional: false)
        value = params[name]
        return value if value.is_a?(String) && (empty || !value.empty?)
        return nil if optional

        raise BadRequest, "#{name} is required"
      end

      def number(name, default, range)
        value = param(name) or return default
        Integer(value, 10).tap { |n| raise ArgumentError unless range.cover?(n) }
      rescue ArgumentError
        raise BadRequest, "#{name} must be a whole number from #{range.min} to #{range.max}, got #{value.inspect}"
      end
    end
  end
end
