from wagtail import blocks
from wagtail.fields import RichTextField, StreamField
from wagtail.images.blocks import ImageChooserBlock
from wagtail.models import Page
from wagtail.search import index


class ArticlePage(Page):
    """A page whose body links to another page and shows an image: what the reference index
    records, and words the search index finds."""

    intro = RichTextField(blank=True)
    body = StreamField(
        [
            ("paragraph", blocks.RichTextBlock()),
            ("related", blocks.PageChooserBlock()),
            ("image", ImageChooserBlock()),
        ],
        blank=True,
    )

    search_fields = [*Page.search_fields, index.SearchField("intro"), index.SearchField("body")]
    content_panels = [*Page.content_panels, "intro", "body"]
