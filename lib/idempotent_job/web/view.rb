# frozen_string_literal: true

require "erb"
require "json"
require "rack/utils"

module IdempotentJob
  class Web
    # Renders the page's ERB templates (`web/views`) for one request, with the helpers
    # they use: escaping, links under the mount point, the CSRF form field, times.
    # The same templates serve the standalone app and the Sidekiq Web tab; only the
    # context differs (mount point, CSRF field, CSP nonce, whether a layout is added).
    class View
      # Where the templates are.
      VIEWS = File.expand_path("views", __dir__)
      # Record statuses, in the order an operator meets them.
      STATUSES = %w[claimed completed released held given_up].freeze

      @templates = {}
      @lock = Mutex.new

      class << self
        # @param name [String] a template of {VIEWS}, without ".erb"
        # @return [ERB] compiled once per process
        def template(name)
          @lock.synchronize do
            @templates[name] ||= ERB.new(File.read(File.join(VIEWS, "#{name}.erb")), trim_mode: "-").tap do |erb|
              erb.filename = File.join(VIEWS, "#{name}.erb")
            end
          end
        end
      end

      # @return [String] the path the pages are mounted under ("" at the root)
      attr_reader :base
      # @return [String, nil] a message shown on every page (e.g. no session for CSRF)
      attr_reader :notice

      # @param base [String] the mount point, e.g. "/idempotency" or "/sidekiq/idempotency"
      # @param csrf_field [String] the hidden input (HTML) every POST form carries
      # @param nonce [String, nil] the CSP nonce for the inline `<style>` (Sidekiq 8)
      # @param notice [String, nil] a message for every page
      # @param layout [Boolean] whether {#layout} wraps pages in a full HTML document
      #   (false inside Sidekiq Web, which has its own)
      def initialize(base:, csrf_field:, nonce: nil, notice: nil, layout: true)
        @base = base.chomp("/")
        @csrf_field = csrf_field.to_s
        @nonce = nonce
        @notice = notice
        @layout = layout
      end

      # @param name [String] the template
      # @param locals [Hash{Symbol => Object}] variables the template reads
      # @return [String] HTML
      def render(name, **locals)
        scope = binding
        locals.each { |key, value| scope.local_variable_set(key, value) }
        self.class.template(name).result(scope)
      end

      # A page: its style, navigation and content.
      # @param name [String] the page's template
      # @param title [String] the page's heading
      # @param locals [Hash] variables the template reads
      # @return [String] HTML
      def page(name, title:, **locals)
        current = %w[record confirm].include?(name) ? "records" : name
        render("page", title:, current:, content: render(name, **locals))
      end

      # @param body [String] what {#page} returned
      # @return [String] a whole HTML document, or `body` itself inside Sidekiq Web
      def layout(body)
        @layout ? render("layout", body:) : body
      end

      # @param text [Object]
      # @return [String] HTML-escaped text
      def h(text)
        ERB::Util.html_escape(text.to_s)
      end

      # A record's arguments or stored result as JSON text (not yet escaped). They nest
      # as deep as the core accepted them (Native::MAX_NESTING levels, a Python producer's
      # too) and were already parsed at that depth; Ruby's JSON.generate stops at 100 by
      # default, which raised JSON::NestingError out of the page.
      # @param value [Object] a JSON value read from the record
      # @return [String] its JSON text
      def json(value)
        JSON.generate(value, max_nesting: false)
      end

      # @param sub [String] a page, e.g. "/records"
      # @param query [Hash] query parameters (nil values left out)
      # @return [String] the URL under the mount point
      def url(sub = "", **query)
        query = query.compact.transform_keys(&:to_s)
        "#{base}#{sub.empty? ? "/" : sub}#{"?#{::Rack::Utils.build_query(query)}" unless query.empty?}"
      end

      # @return [String] {#url}, HTML-escaped for an attribute
      def path(...)
        h(url(...))
      end

      # @return [String] the CSRF hidden field for a POST form
      attr_reader :csrf_field

      # @return [String] ` nonce="…"` for inline elements, or ""
      def nonce_attr
        @nonce ? %( nonce="#{h(@nonce)}") : ""
      end

      # @param time [Time, nil]
      # @return [String] the time in UTC, to the second ("—" for nil)
      def time(time)
        time ? time.utc.strftime("%Y-%m-%d %H:%M:%S UTC") : "—"
      end

      # @param time [Time, nil]
      # @return [String] how long ago, e.g. "3 min ago" ("—" for nil)
      def ago(time)
        return "—" unless time

        seconds = Time.now - time
        return "in #{duration(-seconds)}" if seconds.negative?

        "#{duration(seconds)} ago"
      end

      # @param seconds [Numeric]
      # @return [String] e.g. "45 s", "12 min", "3.5 h", "2.0 d"
      def duration(seconds)
        return "#{seconds.round} s" if seconds < 90
        return "#{(seconds / 60).round} min" if seconds < 5400
        return "#{(seconds / 3600).round(1)} h" if seconds < 172_800

        "#{(seconds / 86_400).round(1)} d"
      end

      # @param status [Symbol, String]
      # @return [String] a coloured status label (HTML)
      def status(status)
        %(<span class="ij-status ij-#{h(status)}">#{h(status.to_s.tr("_", " "))}</span>)
      end

      # @param repeat [Repeats::Classifier::Repeat]
      # @return [String] its cause, timing and producer (HTML)
      def repeat_text(repeat)
        text = "#{Repeats::Classifier::LABELS.fetch(repeat.cause)} +#{duration(repeat.after_claim.to_f)}"
        text += " (deferred copy back)" if repeat.deferred_return
        fresh = !repeat.deferred_return
        text += ", #{duration(repeat.after_enqueue)} after its enqueue" if repeat.after_enqueue && fresh
        text += ", near the restart at #{time(repeat.restart)}" if repeat.restart
        html = h(text)
        html += %( by <span class="ij-key">#{h(repeat.producer)}</span>) if repeat.producer && fresh
        fresh ? html : %(<span class="ij-hint">#{html}</span>)
      end

      # A list's row for a record the core cannot read ({Records::Unreadable}): its job
      # type (unless the list is of one), its key linking to its record page (the 500
      # naming it) and which column, across the `span` columns after the key.
      # @return [String] HTML
      def unreadable_row(record, span, job_type: true)
        cells = job_type ? "<td>#{h record.job_type}</td>" : ""
        %(<tr class="ij-unreadable">#{cells}<td class="ij-key">#{record_link(record)}</td>) +
          %(<td colspan="#{span}" class="ij-error-text" title="#{h record.message}">unreadable: ) +
          %(#{h record.column}</td></tr>)
      end

      # @param record [Record, Records::Unreadable] a record (or a list's unreadable row)
      # @param text [String] the link's text (default: the operation key)
      # @return [String] a link to the record's page (HTML)
      def record_link(record, text = record.operation_key)
        %(<a href="#{path("/record", job_type: record.job_type, operation_key: record.operation_key)}">#{h(text)}</a>)
      end
    end
  end
end
