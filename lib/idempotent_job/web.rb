# frozen_string_literal: true

require "rack"
require "idempotent_job"
require_relative "web/csrf_token"
require_relative "web/chart"
require_relative "web/records"
require_relative "web/view"
require_relative "web/actions"
require_relative "web/sidekiq_tab"

module IdempotentJob
  # The operators' web page, a Rack app: held and given-up operations with "resolve as
  # done" / "rerun" (POST, CSRF-protected, after a confirmation page), a record search
  # by job type and operation key, the repeats report with a chart of repeats over time,
  # recent takeovers and stale claims, and `/metrics` in Prometheus' text format
  # ({Records.metrics}). Everything it shows is read from
  # `idempotent_job_records` through the public API ({IdempotentJob.held},
  # {IdempotentJob.record}, {IdempotentJob.repeats}) and the read-only lists of
  # {Web::Records}; the only write is {IdempotentJob.resolve}. No asset is fetched:
  # CSS is inline and the chart is inline SVG drawn on the server.
  #
  #   # config/routes.rb (behind your own authentication)
  #   require "idempotent_job/web"
  #   mount IdempotentJob::Web => "/idempotency"
  #
  # CSRF: a POST must carry the token of the visitor's Rack session (`rack.session`,
  # which Rails provides; a bare Rack app needs a session middleware such as
  # `Rack::Session::Cookie` in front). Without a session, pages render and every POST
  # is refused (403) with a message saying so.
  #
  # When Sidekiq Web is loaded before this file (`require "sidekiq/web"`), the same pages
  # are also an "Idempotency" tab of Sidekiq Web, protected by Sidekiq Web's own CSRF
  # check (see {SidekiqTab}; call {SidekiqTab.register} when Sidekiq Web comes later).
  class Web
    # Why a POST with a session was refused.
    BAD_TOKEN = "the form's CSRF token is missing or does not match this session"
    # What Rack raises for a query or form it cannot parse (ParamsTooDeepError: Rack 3).
    PARSE_ERRORS = [::Rack::Utils::InvalidParameterError, ::Rack::Utils::ParameterTypeError,
                    (::Rack::QueryParser::ParamsTooDeepError if defined?(::Rack::QueryParser::ParamsTooDeepError)),
                    EncodingError].compact.freeze

    # @return [Web] the app `mount IdempotentJob::Web` runs
    def self.app
      @app ||= new
    end

    # Rack entry point of the class itself, so that the class can be mounted.
    # @param env [Hash] the Rack environment
    # @return [Array] a Rack response
    def self.call(env)
      app.call(env)
    end

    # @param limit [Integer] rows per list (default 200)
    def initialize(limit: Actions::LIMIT)
      @limit = Integer(limit)
    end

    # @param env [Hash] the Rack environment (PATH_INFO relative to the mount point)
    # @return [Array] a Rack response: 200 page, 302 after a resolve, 403 for a POST
    #   without a valid CSRF token, 404/405 for an unknown route, 409 for a resolve the
    #   record does not allow, 503 naming the problem when the database cannot be read
    #   (down, a wrong role or password, the table missing; see {Actions})
    def call(env)
      request = ::Rack::Request.new(env)
      bad = unparsable(request) and return bad
      verb = request.request_method.downcase.to_sym
      verb = :get if verb == :head
      return forbidden(env) if verb == :post && !CsrfToken.valid?(env, request.params[CsrfToken::FIELD])

      view = View.new(base: env["SCRIPT_NAME"].to_s, csrf_field: CsrfToken.field(env),
                      notice: CsrfToken.session?(env) ? nil : CsrfToken::NO_SESSION)
      respond(Actions.new(limit: @limit).call(verb, request.path_info.chomp("/"), request.params, view), view)
    end

    private

    def respond(result, view)
      case result
      in [:html, status, body]
        html(status, view.layout(body))
      in [:redirect, location]
        [302, { "location" => location, "content-type" => "text/html" }, []]
      in [:text, status, type, body]
        [status, { "content-type" => type, "cache-control" => "no-store" }, [body]]
      in [:csv, filename, body]
        [200, { "content-type" => "text/csv; charset=utf-8",
                "content-disposition" => "attachment; filename=\"#{filename}\"" }, [body]]
      end
    end

    def html(status, body)
      [status, { "content-type" => "text/html; charset=utf-8", "cache-control" => "no-store",
                 "x-frame-options" => "SAMEORIGIN" }, [body]]
    end

    # A 400 when the query or form cannot be parsed (a malformed %-escape, a nesting
    # conflict, too many parameters), else nil. A parameter name that is not UTF-8 gets the
    # words {Actions#check_params!} uses: Rack 2 cannot split such a name (an encoding error),
    # Rack 3 hands it on to that check.
    def unparsable(request)
      request.params
      nil
    rescue *PARSE_ERRORS => e
      problem = if invalid_bytes?(e) then "a parameter name is not valid UTF-8"
                else
                  "the query or form cannot be read: #{e.message.scrub.delete("\0")}"
                end
      [400, { "content-type" => "text/plain; charset=utf-8" }, ["Bad request: #{problem}.\n"]]
    end

    # Whether ERROR (or what caused it) is Ruby's "invalid byte sequence" for a string.
    def invalid_bytes?(error)
      while error
        return true if error.is_a?(EncodingError) || error.message.scrub.include?("invalid byte sequence")

        error = error.cause
      end
      false
    end

    def forbidden(env)
      reason = CsrfToken.session?(env) ? BAD_TOKEN : CsrfToken::NO_SESSION
      [403, { "content-type" => "text/plain; charset=utf-8" }, ["Forbidden: #{reason}. Reload the page, then retry.\n"]]
    end
  end
end
